//! Plain device memory: `cuMemAlloc_v2`, `cuMemAllocManaged` and
//! `cuMemAllocPitch_v2` take whole granules of the current context's
//! device; `cuMemGetInfo_v2` reports the device's physical usage across
//! every process; and the device addresses every allocation kind hands out.

use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUdeviceptr, CUresult, granular,
};
use crate::context::current_device;
use crate::devices::physical;
use crate::inject;

/// `cuMemAllocPitch` aligns rows to this many bytes.
const PITCH_ALIGNMENT: u64 = 512;

/// Next device address handed out by this process.
static NEXT_ADDRESS: AtomicU64 = AtomicU64::new(0x7f00_0000_0000);
/// Live allocations of this process: address → (device, bytes).
static ALLOCATIONS: Mutex<Option<HashMap<CUdeviceptr, (usize, u64)>>> = Mutex::new(None);

/// A new device address range of `bytes` (never reused in this process).
pub(crate) fn new_address(bytes: u64) -> CUdeviceptr {
    let span = bytes.div_ceil(256) * 256 + 256;
    NEXT_ADDRESS.fetch_add(span, Ordering::Relaxed)
}

/// A device allocation on the current context's device: takes whole
/// granules, as the real driver does (small allocations do not share them).
fn allocate(dptr: *mut CUdeviceptr, bytes: u64) -> Result<(), CUresult> {
    let dev = current_device()?;
    if dptr.is_null() || bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = granular(bytes).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    if !physical()?.reserve(dev, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let address = new_address(bytes);
    ALLOCATIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(address, (dev, bytes));
    // SAFETY: checked non-NULL above; valid for writes per the C contract.
    unsafe { dptr.write(address) };
    Ok(())
}

/// `cuMemAlloc_v2`.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    inject::guard("cuMemAlloc_v2", || allocate(dptr, bytesize as u64))
}

/// `cuMemAllocManaged`: `flags` must be `CU_MEM_ATTACH_GLOBAL` (1) or
/// `CU_MEM_ATTACH_HOST` (2); counted as device memory.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    inject::guard("cuMemAllocManaged", || {
        if flags != 1 && flags != 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        allocate(dptr, bytesize as u64)
    })
}

/// `cuMemAllocPitch_v2`: rows are aligned to 512 bytes; `element_size` must
/// be 4, 8 or 16.
///
/// # Safety
///
/// `dptr` and `pitch` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    inject::guard("cuMemAllocPitch_v2", || {
        current_device()?;
        if pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&element_size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = (width as u64).div_ceil(PITCH_ALIGNMENT) * PITCH_ALIGNMENT;
        let bytes = row
            .checked_mul(height as u64)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        allocate(dptr, bytes)?;
        // SAFETY: checked non-NULL above.
        unsafe { pitch.write(row as usize) };
        Ok(())
    })
}

/// Frees a plain allocation (`cuMemAlloc*`); an unknown address is
/// `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn free_plain(dptr: CUdeviceptr) -> Result<(), CUresult> {
    let (dev, bytes) = ALLOCATIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|map| map.remove(&dptr))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    physical()?.release(dev, bytes);
    Ok(())
}

/// `cuMemGetInfo_v2`: the current device's physical free and total bytes,
/// across every process using the state file.
///
/// # Safety
///
/// `free` and `total` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    inject::guard("cuMemGetInfo_v2", || {
        let dev = current_device()?;
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let physical = physical()?;
        let all = physical.total(dev);
        // SAFETY: both checked non-NULL above.
        unsafe {
            free.write(all.saturating_sub(physical.used(dev)) as usize);
            total.write(all as usize);
        }
        Ok(())
    })
}
