//! Virtual memory management: physical allocations are charged to the
//! device they name, and the charge lasts as long as the driver keeps the
//! memory: until the last of the handle's references (`cuMemCreate`'s, each
//! `cuMemRetainAllocationHandle`'s) is released and its last mapping is
//! unmapped.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::accounting::keys::Key;
use crate::policy::process::{State, enforcer_or_return, state};
use crate::sys::{
    CU_MEM_LOCATION_TYPE_DEVICE, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, CUdeviceptr,
    CUmemAllocationProp, CUmemGenericAllocationHandle, CUresult,
};

/// `cuMemCreate` (virtual memory management): a physical allocation on a
/// device is charged `size` to the device named in `prop->location`, not to
/// the current context's (a worker thread may have none). Host locations are
/// not device memory and pass through.
///
/// # Safety
///
/// `handle` and `prop` as for `cuMemCreate`.
pub(crate) unsafe fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let enforcer = enforcer_or_return!(real!(cuMemCreate(handle, size, prop, flags)));
    // SAFETY: `prop` is NULL or points to a CUmemAllocationProp (caller's contract).
    let location = unsafe { prop.as_ref() }.map(|p| p.location);
    let dev = match location {
        Some(location) if location.type_ == CU_MEM_LOCATION_TYPE_DEVICE => location.id,
        _ => return real!(cuMemCreate(handle, size, prop, flags)),
    };
    enforcer.charged(
        dev,
        size as u64,
        || match real!(cuMemCreate(handle, size, prop, flags)) {
            // SAFETY: the driver succeeded, so `handle` is valid and written.
            CUDA_SUCCESS => Ok((Key::Handle(unsafe { *handle }), size as u64)),
            rc => Err(rc),
        },
        |key| {
            if let Key::Handle(handle) = key {
                real!(cuMemRelease(handle));
            }
        },
    )
}

/// `cuMemRelease`: releases one reference to the handle; the last returns
/// what it was charged.
///
/// The charge follows the handle's references (`cuMemCreate`'s, each
/// `cuMemRetainAllocationHandle`'s and each mapping's, see [`mem_map`]), as
/// the driver keeps the memory until the last of them is gone.
///
/// # Safety
///
/// None beyond `cuMemRelease`'s.
pub(crate) unsafe fn mem_release(handle: CUmemGenericAllocationHandle) -> CUresult {
    match state() {
        State::Disabled => real!(cuMemRelease(handle)),
        State::Refused => CUDA_ERROR_NOT_INITIALIZED,
        State::Enforcing(enforcer) => {
            enforcer.freed(Key::Handle(handle), || real!(cuMemRelease(handle)))
        }
    }
}

/// `cuMemRetainAllocationHandle`: the driver returns the same handle as
/// `cuMemCreate` did, with one more reference that needs its own
/// `cuMemRelease`; the charge stays until the last of them.
///
/// # Safety
///
/// `handle` as for `cuMemRetainAllocationHandle`.
pub(crate) unsafe fn retain_allocation_handle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemRetainAllocationHandle(handle, addr)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state()) {
        // SAFETY: the driver succeeded, so `handle` is valid and written.
        let retained = unsafe { *handle };
        enforcer.retained(Key::Handle(retained));
    }
    rc
}

/// Mappings of charged handles in this process: start address → (handle,
/// size). Each holds a reference to its handle's charge.
static MAPPINGS: Mutex<Option<HashMap<CUdeviceptr, (CUmemGenericAllocationHandle, u64)>>> =
    Mutex::new(None);

/// `cuMemMap`: a mapping keeps the physical memory alive after every
/// `cuMemRelease` of its handle (the usual idiom releases the handle right
/// after mapping it), so it holds a reference to the handle's charge until
/// `cuMemUnmap`.
///
/// # Safety
///
/// None beyond `cuMemMap`'s.
pub(crate) unsafe fn mem_map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemMap(ptr, size, offset, handle, flags)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state())
        && enforcer.retained(Key::Handle(handle))
    {
        MAPPINGS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(ptr, (handle, size as u64));
    }
    rc
}

/// `cuMemUnmap`: every mapping in the range gives back its reference to its
/// handle's charge (the last reference returns the bytes).
///
/// # Safety
///
/// None beyond `cuMemUnmap`'s.
pub(crate) unsafe fn mem_unmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemUnmap(ptr, size)),
    };
    let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state()) else {
        return rc;
    };
    let end = ptr.saturating_add(size as u64);
    let unmapped: Vec<CUmemGenericAllocationHandle> = {
        let mut mappings = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mappings) = mappings.as_mut() else {
            return rc;
        };
        let starts: Vec<CUdeviceptr> = mappings
            .keys()
            .copied()
            .filter(|start| (ptr..end).contains(start))
            .collect();
        starts
            .iter()
            .filter_map(|start| mappings.remove(start).map(|(handle, _)| handle))
            .collect()
    };
    for handle in unmapped {
        enforcer.freed(Key::Handle(handle), || CUDA_SUCCESS);
    }
    rc
}
