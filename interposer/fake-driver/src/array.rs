//! CUDA arrays: `cuArrayCreate_v2`, `cuArray3DCreate_v2`,
//! `cuMipmappedArrayCreate` and their destroys.
//!
//! An array takes device memory by this rule (the interposer charges the
//! same, see `docs/interposer.md`): each row of a level is padded to 64 bytes
//! and, for 2D and 3D arrays, its height to a multiple of 8 rows (one GOB of
//! the block-linear layout); levels shrink by half in every dimension but the
//! layers of a layered or cubemap array; the sum over levels, layers and
//! depth is rounded up to the 2 MiB granularity. Sparse and deferred-mapping
//! arrays take nothing until memory is mapped into them. Formats: the eight
//! basic ones (8, 16 and 32-bit integers, half and float), 1, 2 or 4 channels.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, granular, guard, write,
};
use crate::context::current_device;
use crate::devices::{initialized, physical};

const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;
const CUDA_ARRAY3D_CUBEMAP: c_uint = 0x04;
const CUDA_ARRAY3D_SPARSE: c_uint = 0x40;
const CUDA_ARRAY3D_DEFERRED_MAPPING: c_uint = 0x80;

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_int,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    channels: c_uint,
    flags: c_uint,
}

/// Bytes per channel of a basic `CUarray_format`.
fn channel_bytes(format: c_int) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => Some(2), // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => Some(4), // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => None,
    }
}

/// The bytes an array takes (see the module), `None` if the descriptor is
/// invalid for the fake.
fn footprint(d: &Array3dDescriptor, levels: u32) -> Option<u64> {
    let element = channel_bytes(d.format)? * u64::from(d.channels);
    let cubemap = d.flags & CUDA_ARRAY3D_CUBEMAP != 0;
    let layered = d.flags & CUDA_ARRAY3D_LAYERED != 0;
    let (w, h, depth) = (d.width as u64, d.height as u64, d.depth as u64);
    let valid = w > 0
        && [1, 2, 4].contains(&d.channels)
        && (!cubemap || (w == h && depth > 0 && depth.is_multiple_of(6)))
        && (1..=64 - w.max(h).max(depth).leading_zeros()).contains(&levels);
    if !valid {
        return None;
    }
    if d.flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0 {
        return Some(0);
    }
    let mut total: u64 = 0;
    for level in 0..levels {
        let row = ((w >> level).max(1) * element).next_multiple_of(64);
        let rows = if h == 0 {
            1
        } else {
            (h >> level).max(1).next_multiple_of(8)
        };
        let slices = if layered || cubemap {
            depth.max(1)
        } else {
            (depth >> level).max(1)
        };
        total = total.checked_add(row.checked_mul(rows)?.checked_mul(slices)?)?;
    }
    granular(total)
}

/// Live arrays and mipmapped arrays of this process: handle → (device, bytes).
static ARRAYS: Mutex<Option<HashMap<usize, (usize, u64)>>> = Mutex::new(None);
static NEXT_ARRAY: AtomicU64 = AtomicU64::new(0x7000_0000);

fn create(out: *mut *mut c_void, d: &Array3dDescriptor, levels: u32) -> Result<(), CUresult> {
    let dev = current_device()?;
    let bytes = footprint(d, levels).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if !physical()?.reserve(dev, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let handle = NEXT_ARRAY.fetch_add(16, Ordering::Relaxed) as usize;
    ARRAYS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(handle, (dev, bytes));
    // SAFETY: checked non-NULL above; valid for writes per the C contract.
    unsafe { write(out, handle as *mut c_void) }
}

fn destroy(handle: *mut c_void) -> Result<(), CUresult> {
    initialized()?;
    let (dev, bytes) = ARRAYS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|arrays| arrays.remove(&(handle as usize)))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    physical()?.release(dev, bytes);
    Ok(())
}

/// `cuArrayCreate_v2`: a 1D (height 0) or 2D array.
///
/// # Safety
///
/// `out` is NULL or valid for writes; `desc` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut *mut c_void,
    desc: *const ArrayDescriptor,
) -> CUresult {
    guard(|| {
        // SAFETY: NULL or valid per the caller.
        let d = unsafe { desc.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = Array3dDescriptor {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        };
        create(out, &d, 1)
    })
}

/// `cuArray3DCreate_v2`.
///
/// # Safety
///
/// `out` is NULL or valid for writes; `desc` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut *mut c_void,
    desc: *const Array3dDescriptor,
) -> CUresult {
    guard(|| {
        // SAFETY: NULL or valid per the caller.
        let d = unsafe { desc.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create(out, d, 1)
    })
}

/// `cuMipmappedArrayCreate`.
///
/// # Safety
///
/// `out` is NULL or valid for writes; `desc` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut *mut c_void,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    guard(|| {
        // SAFETY: NULL or valid per the caller.
        let d = unsafe { desc.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create(out, d, levels)
    })
}

/// `cuArrayDestroy`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(array: *mut c_void) -> CUresult {
    guard(|| destroy(array))
}

/// `cuMipmappedArrayDestroy`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: *mut c_void) -> CUresult {
    guard(|| destroy(array))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(w: usize, h: usize, d: usize, format: c_int, channels: c_uint) -> Array3dDescriptor {
        Array3dDescriptor {
            width: w,
            height: h,
            depth: d,
            format,
            channels,
            flags: 0,
        }
    }

    #[test]
    fn arrays_take_padded_rows_and_whole_granules() {
        const MIB: u64 = 1 << 20;
        // 1024 × 1024 float4: 16 MiB exactly.
        assert_eq!(footprint(&desc(1024, 1024, 0, 0x20, 4), 1), Some(16 * MIB));
        // 1D: one row, 1000 bytes → one granule.
        assert_eq!(footprint(&desc(1000, 0, 0, 0x01, 1), 1), Some(2 * MIB));
        // 3 rows of a 2D array are padded to 8.
        assert_eq!(footprint(&desc(1 << 20, 3, 0, 0x01, 1), 1), Some(8 * MIB));
        // 1024² RGBA8 with 11 levels: 5,594,112 bytes → 6 MiB.
        assert_eq!(footprint(&desc(1024, 1024, 0, 0x01, 4), 11), Some(6 * MIB));
        // Too many levels, a bad channel count or format.
        assert_eq!(footprint(&desc(1024, 1024, 0, 0x01, 4), 12), None);
        assert_eq!(footprint(&desc(16, 16, 0, 0x01, 3), 1), None);
        assert_eq!(footprint(&desc(16, 16, 0, 0x77, 1), 1), None);
        let mut cube = desc(512, 512, 6, 0x20, 1);
        cube.flags = CUDA_ARRAY3D_CUBEMAP;
        assert_eq!(footprint(&cube, 1), Some(6 * MIB));
        cube.flags |= CUDA_ARRAY3D_SPARSE;
        assert_eq!(footprint(&cube, 1), Some(0));
    }
}
