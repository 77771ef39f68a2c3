//! Device memory from `cuMemAlloc_v2`, `cuMemAllocManaged` and
//! `cuMemAllocPitch_v2`: reserved in the shared region before the driver
//! allocates, released on failure and on free (and the release helpers the
//! other allocation kinds share).

use std::ffi::c_uint;

use crate::accounting::keys::Key;
use crate::driver::queries::current_device;
use crate::policy::process::{State, enforcer_or_return, state};
use crate::sys::{
    CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, CUdeviceptr, CUresult, PITCH_ALIGNMENT, granular,
};

/// Charges `bytes` (the caller rounds them to what the driver takes) to the
/// current context's device around `call`, a driver allocation that writes
/// the new pointer to `dptr`.
///
/// # Safety
///
/// `dptr` is what `call` writes through (the caller's argument).
unsafe fn charge_pointer(
    dptr: *mut CUdeviceptr,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // SAFETY: `dptr` is what `call` writes, per the caller.
    unsafe { charge_created(dptr, bytes, Key::Pointer, call, free_pointer) }
}

/// Charges `bytes` to the current context's device around `call`, a driver
/// call that writes what it made to `out`, tracked as `key` of it; `undo`
/// frees it when its real size no longer fits.
///
/// # Safety
///
/// `out` is what `call` writes through (the caller's argument).
pub(crate) unsafe fn charge_created<T: Copy>(
    out: *mut T,
    bytes: u64,
    key: impl FnOnce(T) -> Key,
    call: impl FnOnce() -> CUresult,
    undo: impl FnOnce(Key),
) -> CUresult {
    let enforcer = enforcer_or_return!(call());
    let dev = match current_device() {
        Ok(dev) => dev,
        Err(rc) => return rc,
    };
    enforcer.charged(
        dev,
        bytes,
        || match call() {
            // SAFETY: the driver succeeded, so `out` is valid and written.
            CUDA_SUCCESS => Ok((key(unsafe { *out }), bytes)),
            rc => Err(rc),
        },
        undo,
    )
}

/// Frees a pointer with `call` and returns its charge (to its pool, for a
/// stream-ordered allocation).
pub(crate) fn release_pointer(dptr: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
    release_key(Key::Pointer(dptr), call)
}

/// Frees what `key` names with `call` and returns its charge; what was not
/// charged passes through.
pub(crate) fn release_key(key: Key, call: impl FnOnce() -> CUresult) -> CUresult {
    match state() {
        State::Disabled => call(),
        State::Refused => CUDA_ERROR_NOT_INITIALIZED,
        State::Enforcing(enforcer) => enforcer.freed(key, call),
    }
}

/// `cuMemAlloc_v2`, charged `bytesize` rounded up to the 2 MiB granularity.
///
/// # Safety
///
/// `dptr` as for `cuMemAlloc_v2`.
pub(crate) unsafe fn mem_alloc(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let call = || real!(cuMemAlloc_v2(dptr, bytesize));
    // SAFETY: `dptr` is the caller's, which `call` writes.
    unsafe { charge_pointer(dptr, granular(bytesize as u64), call) }
}

/// `cuMemAllocManaged`, charged to the current device in full, in whole
/// granules.
///
/// # Safety
///
/// `dptr` as for `cuMemAllocManaged`.
pub(crate) unsafe fn mem_alloc_managed(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    let call = || real!(cuMemAllocManaged(dptr, bytesize, flags));
    // SAFETY: `dptr` is the caller's, which `call` writes.
    unsafe { charge_pointer(dptr, granular(bytesize as u64), call) }
}

/// `cuMemAllocPitch_v2`, charged `pitch × height` as the driver chose the
/// pitch, rounded up to the 2 MiB granularity: the reservation assumes a
/// 512-byte alignment and is corrected once the real pitch is known.
///
/// # Safety
///
/// `dptr` and `pitch` as for `cuMemAllocPitch_v2`.
pub(crate) unsafe fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    let enforcer = enforcer_or_return!(real!(cuMemAllocPitch_v2(
        dptr,
        pitch,
        width,
        height,
        element_size
    )));
    let dev = match current_device() {
        Ok(dev) => dev,
        Err(rc) => return rc,
    };
    let estimate = granular(
        (width as u64)
            .div_ceil(PITCH_ALIGNMENT)
            .saturating_mul(PITCH_ALIGNMENT)
            .saturating_mul(height as u64),
    );
    enforcer.charged(
        dev,
        estimate,
        || match real!(cuMemAllocPitch_v2(dptr, pitch, width, height, element_size)) {
            // SAFETY: the driver succeeded, so `dptr` and `pitch` are valid and written.
            CUDA_SUCCESS => Ok(unsafe {
                (
                    Key::Pointer(*dptr),
                    granular((*pitch as u64).saturating_mul(height as u64)),
                )
            }),
            rc => Err(rc),
        },
        free_pointer,
    )
}

/// Undoes an allocation whose real size no longer fits the limit.
fn free_pointer(key: Key) {
    if let Key::Pointer(ptr) = key {
        real!(cuMemFree_v2(ptr));
    }
}

/// `cuMemFree_v2`: frees, then returns the allocation's bytes.
///
/// # Safety
///
/// None beyond `cuMemFree_v2`'s.
pub(crate) unsafe fn mem_free(dptr: CUdeviceptr) -> CUresult {
    release_pointer(dptr, || real!(cuMemFree_v2(dptr)))
}
