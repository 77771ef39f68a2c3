//! Memory hooks: reserve in the shared region before the driver allocates,
//! release on failure and on free, and report the container's slice.

use std::ffi::c_uint;

use crate::enforce::{Key, State, state};
use crate::sys::{
    CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, CUdevice, CUdeviceptr, CUresult, PITCH_ALIGNMENT,
    granular,
};

pub(crate) mod array;
pub(crate) mod context;
pub(crate) mod graph;
pub(crate) mod pool;
pub(crate) mod vmm;

/// `cuInit`: sets the process up (so a bad configuration fails here, loudly)
/// and initialises the real driver.
///
/// # Safety
///
/// None beyond `cuInit`'s.
pub(crate) unsafe fn init(flags: c_uint) -> CUresult {
    match state() {
        State::Refused => CUDA_ERROR_NOT_INITIALIZED,
        State::Disabled | State::Enforcing(_) => real!(cuInit(flags)),
    }
}

/// The device of the calling thread's current context.
pub(crate) fn current_device() -> Result<CUdevice, CUresult> {
    let mut dev: CUdevice = 0;
    match real!(cuCtxGetDevice(&mut dev)) {
        CUDA_SUCCESS => Ok(dev),
        rc => Err(rc),
    }
}

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
    let enforcer = match state() {
        State::Disabled => return call(),
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        State::Enforcing(enforcer) => enforcer,
    };
    let dev = match current_device() {
        Ok(dev) => dev,
        Err(rc) => return rc,
    };
    enforcer.charged(
        dev,
        bytes,
        || match call() {
            // SAFETY: the driver succeeded, so `dptr` is valid and written.
            CUDA_SUCCESS => Ok((Key::Pointer(unsafe { *dptr }), bytes)),
            rc => Err(rc),
        },
        free_pointer,
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
    let enforcer = match state() {
        State::Disabled => {
            return real!(cuMemAllocPitch_v2(dptr, pitch, width, height, element_size));
        }
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        State::Enforcing(enforcer) => enforcer,
    };
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

/// What the driver holds for store `id` (see `enforce/stores.rs`), `None`
/// when it cannot say.
pub(crate) fn store_held(id: crate::enforce::StoreId) -> Option<u64> {
    match id {
        crate::enforce::StoreId::Pool(pool) => pool::held(pool),
        crate::enforce::StoreId::Graph(dev) => graph::held(dev),
    }
}
