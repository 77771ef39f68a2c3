//! `nvmlDeviceGetMemoryInfo(_v2)` report the container's slice, so
//! `nvidia-smi` and NVML-based tools inside the container see the limit.
//!
//! An NVML device is matched to the limit of its CUDA ordinal by UUID
//! (`driver/devices.rs`): NVML enumerates in PCI order, CUDA (by default)
//! fastest first.

use crate::driver::devices::{Ordinal, cuda_ordinal};
use crate::policy::process::{State, state};
use crate::sys::{
    NVML_ERROR_UNINITIALIZED, NVML_SUCCESS, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t,
    nvmlReturn_t,
};

/// The device's limit and the container's usage on it, `None` without a
/// limit (the real values then pass through).
fn slice(device: nvmlDevice_t) -> Option<(u64, u64)> {
    let State::Enforcing(enforcer) = state() else {
        return None;
    };
    let Ordinal::Cuda(ordinal) = cuda_ordinal(device)? else {
        // Not one of this process's CUDA devices: no limit of ours applies.
        return None;
    };
    let dev = i32::try_from(ordinal).ok()?;
    let limit = enforcer.limit(dev)?;
    Some((limit, enforcer.used(dev).min(limit)))
}

/// `nvmlDeviceGetMemoryInfo`: with a limit, `total` is the limit, `used`
/// what the container holds and `free` the rest (never negative).
///
/// # Safety
///
/// `memory` as for `nvmlDeviceGetMemoryInfo`.
pub(crate) unsafe fn memory_info(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t {
    if matches!(state(), State::Refused) {
        return NVML_ERROR_UNINITIALIZED;
    }
    let rc = real_nvml!(nvmlDeviceGetMemoryInfo(device, memory));
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    if let Some((limit, used)) = slice(device) {
        // SAFETY: non-NULL, and the real call just filled it.
        let memory = unsafe { &mut *memory };
        memory.total = limit;
        memory.used = used;
        memory.free = limit - used;
    }
    rc
}

/// `nvmlDeviceGetMemoryInfo_v2`: as above, with `reserved` reported as 0
/// (the slice has no system reservation of its own).
///
/// # Safety
///
/// `memory` as for `nvmlDeviceGetMemoryInfo_v2`.
pub(crate) unsafe fn memory_info_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    if matches!(state(), State::Refused) {
        return NVML_ERROR_UNINITIALIZED;
    }
    let rc = real_nvml!(nvmlDeviceGetMemoryInfo_v2(device, memory));
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    if let Some((limit, used)) = slice(device) {
        // SAFETY: non-NULL, and the real call just filled it.
        let memory = unsafe { &mut *memory };
        memory.total = limit;
        memory.reserved = 0;
        memory.used = used;
        memory.free = limit - used;
    }
    rc
}
