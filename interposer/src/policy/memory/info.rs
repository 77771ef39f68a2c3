//! What the CUDA driver reports of device memory, with a limit on the
//! device: the container's slice (`cuMemGetInfo_v2`, `cuDeviceTotalMem_v2`).

use crate::driver::queries::current_device;
use crate::policy::process::{State, state};
use crate::sys::{CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, CUdevice, CUresult};

/// `cuMemGetInfo_v2`: with a limit on the current device, `total` is the
/// limit and `free` is the limit minus what the container holds (never
/// below zero), so `free + used == total`. Without one, the driver's values.
///
/// The real driver is called first with the caller's pointers, so NULL
/// arguments get exactly the driver's answer; only non-NULL outputs of a
/// successful call are rewritten.
///
/// # Safety
///
/// `free` and `total` as for `cuMemGetInfo_v2`.
pub(crate) unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemGetInfo_v2(free, total)),
    };
    let State::Enforcing(enforcer) = state() else {
        return rc;
    };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let Ok(dev) = current_device() else {
        return rc;
    };
    if let Some(limit) = enforcer.limit(dev) {
        let used = enforcer.used(dev).min(limit);
        // SAFETY: the driver accepted these pointers; each is written only if non-NULL.
        unsafe {
            if !total.is_null() {
                *total = usize::try_from(limit).unwrap_or(usize::MAX);
            }
            if !free.is_null() {
                *free = usize::try_from(limit - used).unwrap_or(usize::MAX);
            }
        }
    }
    rc
}

/// `cuDeviceTotalMem_v2`: the device's limit when it has one.
///
/// # Safety
///
/// `bytes` as for `cuDeviceTotalMem_v2`.
pub(crate) unsafe fn device_total_mem(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuDeviceTotalMem_v2(bytes, dev)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state())
        && let Some(limit) = enforcer.limit(dev)
        && !bytes.is_null()
    {
        // SAFETY: the driver wrote through this non-NULL pointer just now.
        unsafe { *bytes = usize::try_from(limit).unwrap_or(usize::MAX) };
    }
    rc
}
