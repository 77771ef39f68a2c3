//! Virtual memory management: physical allocations (`cuMemCreate`,
//! `cuMemRelease`, `cuMemRetainAllocationHandle`), address ranges
//! (`cuMemAddressReserve`, `cuMemAddressFree`) and mappings (`cuMemMap`,
//! `cuMemUnmap`).
//!
//! As on a real driver, a physical allocation is freed when every reference
//! to its handle is released (`cuMemCreate` makes one, each
//! `cuMemRetainAllocationHandle` one more) and every mapping of it is
//! unmapped. The fake maps whole allocations only (offset 0, size = the
//! allocation's).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUdeviceptr, CUresult, GRANULARITY, guard,
    write,
};
use crate::devices::{device, initialized, physical};
use crate::inject;
use crate::memory::new_address;

const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// A physical allocation.
struct Handle {
    dev: usize,
    bytes: u64,
    /// Unreleased references: `cuMemCreate`'s and each retain's.
    refs: u32,
    /// Live mappings.
    maps: u32,
}

#[derive(Default)]
struct Vmm {
    handles: HashMap<u64, Handle>,
    /// Reserved address ranges: start → size.
    ranges: HashMap<CUdeviceptr, u64>,
    /// Mappings: start → (handle, size).
    mappings: HashMap<CUdeviceptr, (u64, u64)>,
}

static VMM: Mutex<Option<Vmm>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

fn with_vmm<T>(body: impl FnOnce(&mut Vmm) -> Result<T, CUresult>) -> Result<T, CUresult> {
    body(
        VMM.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Vmm::default),
    )
}

/// Frees a handle's memory once nothing references or maps it.
fn collect(vmm: &mut Vmm, handle: u64) -> Result<(), CUresult> {
    if let Some(h) = vmm.handles.get(&handle)
        && h.refs == 0
        && h.maps == 0
    {
        physical()?.release(h.dev, h.bytes);
        vmm.handles.remove(&handle);
    }
    Ok(())
}

/// `CUmemAllocationProp`, as far as the fake reads it.
#[repr(C)]
pub struct AllocationProp {
    type_: c_int,
    requested_handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

/// The device a VMM property names, if it is a valid pinned device allocation.
///
/// # Safety
///
/// `prop` is NULL or points to a `CUmemAllocationProp`.
unsafe fn vmm_device(prop: *const AllocationProp) -> Result<usize, CUresult> {
    // SAFETY: NULL or valid per the caller.
    let prop = unsafe { prop.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location_type != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    device(prop.location_id)
}

/// `cuMemGetAllocationGranularity`: 2 MiB for device locations.
///
/// # Safety
///
/// `granularity` is NULL or valid for writes; `prop` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    _option: c_int,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller's pointers, as documented.
        unsafe {
            vmm_device(prop)?;
            write(granularity, GRANULARITY as usize)
        }
    })
}

/// `cuMemCreate`: a physical allocation of a multiple of the granularity on
/// the device named by `prop`; needs no current context.
///
/// # Safety
///
/// `handle` is NULL or valid for writes; `prop` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const AllocationProp,
    flags: u64,
) -> CUresult {
    inject::guard("cuMemCreate", || {
        // SAFETY: the caller's pointer, as documented.
        let dev = unsafe { vmm_device(prop) }?;
        let bytes = size as u64;
        if handle.is_null() || flags != 0 || bytes == 0 || !bytes.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !physical()?.reserve(dev, bytes) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let id = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        with_vmm(|vmm| {
            let h = Handle {
                dev,
                bytes,
                refs: 1,
                maps: 0,
            };
            vmm.handles.insert(id, h);
            Ok(())
        })?;
        // SAFETY: checked non-NULL above.
        unsafe { handle.write(id) };
        Ok(())
    })
}

/// `cuMemRelease`: drops one reference; the memory goes with the last
/// reference and mapping.
///
/// # Safety
///
/// Safe with any value: unknown handles are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(|| {
        initialized()?;
        with_vmm(|vmm| {
            let h = vmm
                .handles
                .get_mut(&handle)
                .filter(|h| h.refs > 0)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            h.refs -= 1;
            collect(vmm, handle)
        })
    })
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `addr` (anywhere in
/// the mapping), with one more reference.
///
/// # Safety
///
/// `handle` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    guard(|| {
        initialized()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let addr = addr as CUdeviceptr;
        let found = with_vmm(|vmm| {
            let (found, _) = *vmm
                .mappings
                .iter()
                .find(|(start, (_, size))| (**start..**start + *size).contains(&addr))
                .map(|(_, mapping)| mapping)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            vmm.handles
                .get_mut(&found)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?
                .refs += 1;
            Ok(found)
        })?;
        // SAFETY: checked non-NULL above.
        unsafe { handle.write(found) };
        Ok(())
    })
}

/// `cuMemAddressReserve`: a fresh range (`addr` and `alignment` hints are
/// ignored).
///
/// # Safety
///
/// `ptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    _alignment: usize,
    _addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    guard(|| {
        initialized()?;
        let size = size as u64;
        if ptr.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let start = new_address(size);
        with_vmm(|vmm| {
            vmm.ranges.insert(start, size);
            Ok(())
        })?;
        // SAFETY: checked non-NULL above.
        unsafe { ptr.write(start) };
        Ok(())
    })
}

/// `cuMemAddressFree`: the whole range, which must have no mappings.
///
/// # Safety
///
/// Safe with any values: unknown ranges are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        initialized()?;
        with_vmm(|vmm| {
            let end = ptr + size as u64;
            if vmm.ranges.get(&ptr) != Some(&(size as u64))
                || vmm.mappings.keys().any(|m| (ptr..end).contains(m))
            {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            vmm.ranges.remove(&ptr);
            Ok(())
        })
    })
}

/// `cuMemMap`: maps a whole allocation at `ptr` inside a reserved range.
///
/// # Safety
///
/// Safe with any values: invalid ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    guard(|| {
        initialized()?;
        let size = size as u64;
        with_vmm(|vmm| {
            let inside = vmm
                .ranges
                .iter()
                .any(|(start, len)| ptr >= *start && ptr + size <= start + len);
            let end = ptr + size;
            let overlaps = vmm
                .mappings
                .iter()
                .any(|(start, (_, len))| *start < end && ptr < start + len);
            let h = vmm.handles.get_mut(&handle).filter(|h| h.refs > 0);
            match h {
                Some(h) if inside && !overlaps && offset == 0 && flags == 0 && h.bytes == size => {
                    h.maps += 1;
                }
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            vmm.mappings.insert(ptr, (handle, size));
            Ok(())
        })
    })
}

/// `cuMemUnmap`: the mapping at `ptr` of `size` bytes.
///
/// # Safety
///
/// Safe with any values: unknown mappings are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        initialized()?;
        with_vmm(|vmm| {
            let (handle, len) = *vmm.mappings.get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if len != size as u64 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            vmm.mappings.remove(&ptr);
            if let Some(h) = vmm.handles.get_mut(&handle) {
                h.maps -= 1;
            }
            collect(vmm, handle)
        })
    })
}
