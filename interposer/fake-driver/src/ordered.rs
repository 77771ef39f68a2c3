//! Stream-ordered allocation: `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`
//! and `cuMemFreeAsync` (and the `_ptsz` variants, counted). Immediate, from
//! a pool (`pool.rs`); on a stream being captured they add graph nodes
//! instead (`exec/graph.rs`).

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use crate::base::{CUDA_ERROR_INVALID_VALUE, CUdeviceptr, CUresult, PER_THREAD_CALLS, guard};
use crate::context::current_device;
use crate::devices::initialized;
use crate::exec::graph::{capture_alloc, capture_free};
use crate::pool::{self, CUmemoryPool};

/// Allocates `bytes` from `pool` (NULL: the current device's current pool)
/// on `stream`; on a stream being captured, an allocation node instead.
fn allocate(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: *mut c_void,
    per_thread: bool,
) -> Result<(), CUresult> {
    let dev = current_device()?;
    if dptr.is_null() || bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(address) = capture_alloc(stream, per_thread, dev, bytes as u64)? {
        // SAFETY: checked non-NULL above; valid for writes per the C contract.
        unsafe { dptr.write(address) };
        return Ok(());
    }
    let address = pool::allocate(dev, bytes as u64, pool)?;
    // SAFETY: checked non-NULL above; valid for writes per the C contract.
    unsafe { dptr.write(address) };
    Ok(())
}

/// `cuMemAllocAsync`: from the current pool of the current context's
/// device, immediately.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: *mut c_void,
) -> CUresult {
    guard(|| allocate(dptr, bytesize, std::ptr::null_mut(), stream, false))
}

/// `cuMemAllocAsync_ptsz`: the per-thread-default-stream variant; counted.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: *mut c_void,
) -> CUresult {
    PER_THREAD_CALLS.fetch_add(1, Ordering::Relaxed);
    guard(|| allocate(dptr, bytesize, std::ptr::null_mut(), stream, true))
}

/// `cuMemAllocFromPoolAsync`.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: *mut c_void,
) -> CUresult {
    guard(|| {
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        allocate(dptr, bytesize, pool, stream, false)
    })
}

/// `cuMemAllocFromPoolAsync_ptsz`; counted.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: *mut c_void,
) -> CUresult {
    PER_THREAD_CALLS.fetch_add(1, Ordering::Relaxed);
    guard(|| {
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        allocate(dptr, bytesize, pool, stream, true)
    })
}

/// `cuMemFreeAsync`.
///
/// # Safety
///
/// Safe with any value: unknown addresses are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: *mut c_void) -> CUresult {
    guard(|| free_async(dptr, stream, false))
}

/// A free node when the stream is being captured, else a free.
fn free_async(dptr: CUdeviceptr, stream: *mut c_void, per_thread: bool) -> Result<(), CUresult> {
    initialized()?;
    if capture_free(stream, per_thread)? {
        return Ok(());
    }
    crate::free::free(dptr)
}

/// `cuMemFreeAsync_ptsz`; counted.
///
/// # Safety
///
/// Safe with any value: unknown addresses are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: *mut c_void) -> CUresult {
    PER_THREAD_CALLS.fetch_add(1, Ordering::Relaxed);
    guard(|| free_async(dptr, stream, true))
}
