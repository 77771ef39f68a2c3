//! CUDA arrays and mipmapped arrays, charged their footprint by the rule of
//! [`footprint`] to the current context's device, and returned by
//! `cuArrayDestroy` and `cuMipmappedArrayDestroy`.

use crate::accounting::keys::Key;
use crate::policy::memory::alloc::{charge_created, release_key};
use crate::policy::process::{State, state};
use crate::sys::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_DEFERRED_MAPPING,
    CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_LAYERED, CUDA_ARRAY3D_SPARSE, CUarray, CUmipmappedArray,
    CUresult, granular,
};

/// Bytes per element of a `CUarray_format` with `channels` channels: the
/// eight basic formats (8, 16 and 32-bit integers, half, float) exactly,
/// every other (normalised, packed, planar, block-compressed) as 16 bytes,
/// the largest element a CUDA array has, so that none is undercharged.
fn element_bytes(format: i32, channels: u32) -> u64 {
    let channel = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => return 16,
    };
    channel * u64::from(channels.clamp(1, 4))
}

/// The device memory an array takes: each row of each mip level padded to
/// 64 bytes and, for 2D and 3D arrays, its height to a multiple of 8 rows
/// (one GOB of the block-linear layout NVIDIA GPUs store arrays in); levels
/// halve every dimension but the layers of a layered or cubemap array; the
/// sum over levels, layers and depth rounded up to the 2 MiB granularity.
/// Sparse and deferred-mapping arrays take nothing until memory is mapped
/// into them (that memory is a `cuMemCreate`, charged there). Saturates
/// rather than wrapping.
pub(crate) fn footprint(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> u64 {
    if d.flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0 {
        return 0;
    }
    let element = element_bytes(d.format, d.num_channels);
    let keep_depth = d.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let (w, h, depth) = (d.width as u64, d.height as u64, d.depth as u64);
    let mut total: u64 = 0;
    for level in 0..levels.clamp(1, 64) {
        let row = (w >> level)
            .max(1)
            .saturating_mul(element)
            .checked_next_multiple_of(64)
            .unwrap_or(u64::MAX);
        let rows = if h == 0 {
            1
        } else {
            (h >> level)
                .max(1)
                .checked_next_multiple_of(8)
                .unwrap_or(u64::MAX)
        };
        let slices = if keep_depth {
            depth.max(1)
        } else {
            (depth >> level).max(1)
        };
        total = total.saturating_add(row.saturating_mul(rows).saturating_mul(slices));
    }
    granular(total)
}

/// Charges `bytes` for an array `create` makes, keyed by `key(handle)`;
/// `destroy` undoes it when its real size no longer fits.
///
/// # Safety
///
/// `out` is what `create` writes (the caller's argument).
unsafe fn charge_array(
    out: *mut CUarray,
    bytes: u64,
    key: fn(u64) -> Key,
    create: impl FnOnce() -> CUresult,
    destroy: fn(CUarray),
) -> CUresult {
    // Nothing to charge: straight to the driver, as when control is
    // disabled (`charge_created` refuses when CUDA is refused).
    if bytes == 0 && matches!(state(), State::Enforcing(_)) {
        return create();
    }
    // SAFETY: `out` is what `create` writes, per the caller.
    unsafe {
        charge_created(
            out,
            bytes,
            |array| key(array as u64),
            create,
            |k| {
                if let Key::Array(h) | Key::Mipmap(h) = k {
                    destroy(h as CUarray);
                }
            },
        )
    }
}

/// `cuArrayCreate_v2`: a 1D or 2D array, charged its [`footprint`].
///
/// # Safety
///
/// `out` and `desc` as for `cuArrayCreate_v2`.
pub(crate) unsafe fn array_create(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    // SAFETY: NULL or a valid descriptor (the caller's contract).
    let bytes = unsafe { desc.as_ref() }.map_or(0, |d| {
        let d3 = CUDA_ARRAY3D_DESCRIPTOR {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            num_channels: d.num_channels,
            flags: 0,
        };
        footprint(&d3, 1)
    });
    let create = || real!(cuArrayCreate_v2(out, desc));
    // SAFETY: `out` is the caller's, which `create` writes.
    unsafe { charge_array(out, bytes, Key::Array, create, destroy_array) }
}

/// `cuArray3DCreate_v2`, charged its [`footprint`].
///
/// # Safety
///
/// `out` and `desc` as for `cuArray3DCreate_v2`.
pub(crate) unsafe fn array_3d_create(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    // SAFETY: NULL or a valid descriptor (the caller's contract).
    let bytes = unsafe { desc.as_ref() }.map_or(0, |d| footprint(d, 1));
    let create = || real!(cuArray3DCreate_v2(out, desc));
    // SAFETY: `out` is the caller's, which `create` writes.
    unsafe { charge_array(out, bytes, Key::Array, create, destroy_array) }
}

/// `cuMipmappedArrayCreate`, charged the [`footprint`] of all its levels.
///
/// # Safety
///
/// `out` and `desc` as for `cuMipmappedArrayCreate`.
pub(crate) unsafe fn mipmapped_array_create(
    out: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: std::ffi::c_uint,
) -> CUresult {
    // SAFETY: NULL or a valid descriptor (the caller's contract).
    let bytes = unsafe { desc.as_ref() }.map_or(0, |d| footprint(d, levels));
    let create = || real!(cuMipmappedArrayCreate(out, desc, levels));
    // SAFETY: `out` is the caller's, which `create` writes.
    unsafe { charge_array(out, bytes, Key::Mipmap, create, destroy_mipmapped) }
}

fn destroy_array(array: CUarray) {
    real!(cuArrayDestroy(array));
}

fn destroy_mipmapped(array: CUmipmappedArray) {
    real!(cuMipmappedArrayDestroy(array));
}

/// `cuArrayDestroy`: destroys, then returns the array's charge.
///
/// # Safety
///
/// None beyond `cuArrayDestroy`'s.
pub(crate) unsafe fn array_destroy(array: CUarray) -> CUresult {
    release_key(Key::Array(array as u64), || real!(cuArrayDestroy(array)))
}

/// `cuMipmappedArrayDestroy`: destroys, then returns the array's charge.
///
/// # Safety
///
/// None beyond `cuMipmappedArrayDestroy`'s.
pub(crate) unsafe fn mipmapped_array_destroy(array: CUmipmappedArray) -> CUresult {
    release_key(Key::Mipmap(array as u64), || {
        real!(cuMipmappedArrayDestroy(array))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn desc(w: usize, h: usize, d: usize, format: i32, channels: u32) -> CUDA_ARRAY3D_DESCRIPTOR {
        CUDA_ARRAY3D_DESCRIPTOR {
            width: w,
            height: h,
            depth: d,
            format,
            num_channels: channels,
            flags: 0,
        }
    }

    #[test]
    fn arrays_are_charged_padded_rows_in_whole_granules() {
        // 1024 × 1024 float4: 16 MiB exactly.
        assert_eq!(footprint(&desc(1024, 1024, 0, 0x20, 4), 1), 16 * MIB);
        // 1D: one 1000-byte row → one granule.
        assert_eq!(footprint(&desc(1000, 0, 0, 0x01, 1), 1), 2 * MIB);
        // 3 rows of a 2D array are padded to 8.
        assert_eq!(footprint(&desc(1 << 20, 3, 0, 0x01, 1), 1), 8 * MIB);
        // A 3D array: 256³ half2 = 64 MiB.
        assert_eq!(footprint(&desc(256, 256, 256, 0x10, 2), 1), 64 * MIB);
        // 1024² RGBA8 with 11 levels: 5,594,112 bytes → 6 MiB.
        assert_eq!(footprint(&desc(1024, 1024, 0, 0x01, 4), 11), 6 * MIB);
        // An unknown format counts 16 bytes per element.
        assert_eq!(footprint(&desc(1024, 1024, 0, 0xb0, 1), 1), 16 * MIB);
    }

    #[test]
    fn layers_and_faces_do_not_shrink_and_sparse_arrays_take_nothing() {
        let mut layered = desc(512, 512, 4, 0x20, 1);
        layered.flags = CUDA_ARRAY3D_LAYERED;
        // Level 0: 4 × 1 MiB; level 1: 4 × 256 KiB.
        assert_eq!(footprint(&layered, 2), 6 * MIB);
        let mut cube = desc(512, 512, 6, 0x20, 1);
        cube.flags = CUDA_ARRAY3D_CUBEMAP;
        assert_eq!(footprint(&cube, 1), 6 * MIB);
        cube.flags |= CUDA_ARRAY3D_SPARSE;
        assert_eq!(footprint(&cube, 1), 0);
        let mut deferred = desc(512, 512, 0, 0x20, 1);
        deferred.flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
        assert_eq!(footprint(&deferred, 1), 0);
    }

    #[test]
    fn absurd_descriptors_saturate() {
        assert_eq!(
            footprint(&desc(usize::MAX, usize::MAX, 0, 0x20, 4), 1),
            u64::MAX
        );
        assert_eq!(footprint(&desc(0, 0, 0, 0x01, 0), 0), 2 * MIB);
    }
}
