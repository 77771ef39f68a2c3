//! The driver's C types and error codes as the fake uses them, and what
//! every export shares: the panic guard, writing through an out pointer,
//! the allocation granularity, and the count of `_ptsz` calls tests read.

use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) type CUresult = c_int;
pub(crate) type CUdevice = c_int;
pub(crate) type CUdeviceptr = u64;
pub(crate) type CUcontext = *mut c_void;

pub(crate) const CUDA_SUCCESS: CUresult = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub(crate) const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub(crate) const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub(crate) const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub(crate) const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// The allocation granularity of real NVIDIA GPUs: `cuMemCreate` sizes must
/// be multiples of it, and `cuMemAlloc`, `cuMemAllocManaged` and
/// `cuMemAllocPitch` take whole multiples of it from the device.
pub(crate) const GRANULARITY: u64 = 2 << 20;

/// Calls of `_ptsz` variants in this process (see `tesseraFakePerThreadCalls`).
pub(crate) static PER_THREAD_CALLS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn guard(body: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(rc)) => rc,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Writes `value` through `out`, or fails with `CUDA_ERROR_INVALID_VALUE`
/// when it is NULL.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
pub(crate) unsafe fn write<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid for writes per the caller.
    unsafe { out.write(value) };
    Ok(())
}

/// `bytes` rounded up to the allocation granularity, `None` on overflow.
pub(crate) fn granular(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(GRANULARITY)
}

/// Not a CUDA function: how many times this process called a `_ptsz`
/// variant, so tests can check per-thread-stream semantics survive hooking.
///
/// # Safety
///
/// Safe to call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tesseraFakePerThreadCalls() -> u64 {
    PER_THREAD_CALLS.load(Ordering::Relaxed)
}
