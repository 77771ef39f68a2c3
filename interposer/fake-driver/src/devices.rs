//! The fake devices: `cuInit`, `cuDriverGetVersion`, enumeration
//! (`cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName`),
//! `cuDeviceTotalMem_v2`, identity (`cuDeviceGetUuid` and `_v2`, the UUIDs
//! of `fake-gpu/src/uuid.rs`, which the fake NVML reports too) and
//! `tesseraFakeStats`; and the physical state every other file reaches
//! through [`physical`].

use std::ffi::{c_char, c_int, c_uint};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use fake_gpu::physical::Physical;

use crate::base::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_UNKNOWN, CUdevice, CUresult, guard, write,
};
use crate::inject;

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static PHYSICAL: OnceLock<Result<Physical, String>> = OnceLock::new();

pub(crate) fn physical() -> Result<&'static Physical, CUresult> {
    match PHYSICAL.get_or_init(Physical::from_env) {
        Ok(physical) => Ok(physical),
        Err(message) => {
            eprintln!("fake libcuda: {message}");
            Err(CUDA_ERROR_UNKNOWN)
        }
    }
}

pub(crate) fn initialized() -> Result<(), CUresult> {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_INITIALIZED)
    }
}

pub(crate) fn device(dev: CUdevice) -> Result<usize, CUresult> {
    initialized()?;
    physical_device(dev).map(|(_, dev)| dev)
}

/// The physical state and device `dev`'s index in it, whether or not
/// `cuInit` ran (for the `tesseraFake*` functions).
pub(crate) fn physical_device(dev: CUdevice) -> Result<(&'static Physical, usize), CUresult> {
    let physical = physical()?;
    let dev = usize::try_from(dev)
        .ok()
        .filter(|&d| d < physical.device_count())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    Ok((physical, dev))
}

/// `cuInit`.
///
/// # Safety
///
/// Safe to call with any value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    inject::guard("cuInit", || {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        physical()?;
        INITIALIZED.store(true, Ordering::Release);
        Ok(())
    })
}

/// `cuDriverGetVersion`.
///
/// # Safety
///
/// `version` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    let reported = std::env::var("FAKE_CUDA_DRIVER_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12090);
    // SAFETY: the caller's pointer, NULL-checked by `write`.
    guard(|| unsafe { write(version, reported) })
}

/// `cuDeviceGetCount`.
///
/// # Safety
///
/// `count` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        initialized()?;
        let n = physical()?.device_count() as c_int;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(count, n) }
    })
}

/// `cuDeviceGet`.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(out: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        let dev = device(ordinal)?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, dev as CUdevice) }
    })
}

/// `cuDeviceGetName`.
///
/// # Safety
///
/// `name` is NULL or valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let text = format!("Tessera Fake GPU {dev}");
        let n = text.len().min(len - 1);
        // SAFETY: `name` is valid for `len` bytes and n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), name, n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

/// `cuDeviceTotalMem_v2`.
///
/// # Safety
///
/// `bytes` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let total = physical()?.total(dev) as usize;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(bytes, total) }
    })
}

/// `cuDeviceGetUuid`: the device's 16-byte UUID.
///
/// # Safety
///
/// `out` is NULL or valid for 16 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], dev: c_int) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
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

/// Not a CUDA function: a device's physical usage and its high-water mark.
///
/// # Safety
///
/// `used` and `peak` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tesseraFakeStats(
    dev: CUdevice,
    used: *mut u64,
    peak: *mut u64,
) -> CUresult {
    guard(|| {
        let (physical, dev) = physical_device(dev)?;
        // SAFETY: the caller's pointers, NULL-checked by `write`.
        unsafe {
            write(used, physical.used(dev))?;
            write(peak, physical.peak(dev))
        }
    })
}
