//! Device identity: `cuDeviceGetUuid` and `cuDeviceGetUuid_v2` (the UUIDs
//! of `fake-gpu/src/uuid.rs`, which the fake NVML reports too).

use std::ffi::c_int;

use crate::{CUresult, guard, write};

/// `cuDeviceGetUuid`: the device's 16-byte UUID.
///
/// # Safety
///
/// `out` is NULL or valid for 16 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], dev: c_int) -> CUresult {
    guard(|| {
        let dev = crate::device(dev)?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, fake_gpu::uuid::uuid(dev)) }
    })
}

/// `cuDeviceGetUuid_v2` (CUDA 11.4): the same for a full GPU (MIG instances,
/// which it tells apart, are not modelled).
///
/// # Safety
///
/// `out` is NULL or valid for 16 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut [u8; 16], dev: c_int) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuDeviceGetUuid(out, dev) }
}
