//! A fake NVML, built as `libnvidia_ml.so` with soname `libnvidia-ml.so.1`,
//! for testing the interposer without a GPU.
//!
//! It reads the fake CUDA driver's device state (the same `FAKE_CUDA_STATE`
//! file, `FAKE_CUDA_DEVICE_COUNT`, `FAKE_CUDA_DEVICE_MEMORY`, through the
//! `tessera-fake-gpu` crate both link), so memory allocated
//! through the fake driver shows as used here, as on a real GPU. Implemented:
//! `nvmlInit_v2`, `nvmlShutdown`, `nvmlDeviceGetCount_v2`,
//! `nvmlDeviceGetHandleByIndex_v2`, `nvmlDeviceGetHandleByUUID`,
//! `nvmlDeviceGetIndex`, `nvmlDeviceGetMemoryInfo`,
//! `nvmlDeviceGetMemoryInfo_v2`, `nvmlDeviceGetUtilizationRates` (from the
//! fake driver's simulated timeline) and, in `processes.rs`,
//! `nvmlDeviceGetComputeRunningProcesses` (v1, `_v2`, `_v3`) and
//! `nvmlDeviceGetProcessUtilization` (from the fake driver's per-process
//! accounting, `fake-gpu/src/procs.rs`), and, in `mig.rs`, MIG (modes,
//! profiles, placements, GPU and compute instances, MIG devices) with
//! `nvmlDeviceGetName`, `nvmlDeviceGetPciInfo_v3` and `nvmlDeviceGetUUID`, with NVML's argument
//! checks and return codes.
//!
//! NVML lists the devices in the order of `FAKE_NVML_DEVICE_ORDER`, a
//! comma-separated permutation of the fake driver's devices (CUDA ordinals):
//! `1,0` makes NVML index 0 the driver's device 1. Unset: the same order.
//! UUIDs are the driver's (`fake-gpu/src/uuid.rs`), so a client can match
//! the two orders as on a real machine, where CUDA may enumerate fastest
//! first and NVML in PCI order.

#![allow(unsafe_code)] // a C ABI library; every block carries a SAFETY comment
#![allow(non_snake_case, non_camel_case_types)] // exports carry NVML's names
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

mod mig;
mod processes;

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use fake_gpu::physical::Physical;
use fake_gpu::{clock, uuid};

type nvmlReturn_t = c_int;
type nvmlDevice_t = *mut c_void;

const NVML_SUCCESS: nvmlReturn_t = 0;
const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `nvmlMemory_v2`: the struct size with version 2 in the top byte.
const NVML_MEMORY_V2: u32 = size_of::<nvmlMemory_v2_t>() as u32 | (2 << 24);

/// Handles are the device index plus this, so that no handle is NULL.
const HANDLE_BASE: usize = 0x1000;

/// `nvmlInit` calls minus `nvmlShutdown` calls.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
static PHYSICAL: OnceLock<Result<Physical, String>> = OnceLock::new();

/// `nvmlMemory_t`.
#[repr(C)]
pub struct nvmlMemory_t {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct nvmlMemory_v2_t {
    version: u32,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

fn guard(body: impl FnOnce() -> Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(rc)) => rc,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

fn physical() -> Result<&'static Physical, nvmlReturn_t> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    match PHYSICAL.get_or_init(Physical::from_env) {
        Ok(physical) => Ok(physical),
        Err(message) => {
            eprintln!("fake libnvidia-ml: {message}");
            Err(NVML_ERROR_UNKNOWN)
        }
    }
}

/// The fake driver's device behind each NVML index (`FAKE_NVML_DEVICE_ORDER`).
fn order() -> Result<&'static [usize], nvmlReturn_t> {
    static ORDER: OnceLock<Result<Vec<usize>, String>> = OnceLock::new();
    let count = physical()?.device_count();
    let order = ORDER.get_or_init(|| match std::env::var("FAKE_NVML_DEVICE_ORDER") {
        Err(_) => Ok((0..count).collect()),
        Ok(v) => {
            let order: Option<Vec<usize>> = v.split(',').map(|d| d.trim().parse().ok()).collect();
            let mut sorted = order.clone().unwrap_or_default();
            sorted.sort_unstable();
            if sorted == (0..count).collect::<Vec<_>>() {
                Ok(order.unwrap_or_default())
            } else {
                Err(format!(
                    "FAKE_NVML_DEVICE_ORDER={v:?}: must list each of the {count} devices once, e.g. 1,0"
                ))
            }
        }
    });
    match order {
        Ok(order) => Ok(order),
        Err(message) => {
            eprintln!("fake libnvidia-ml: {message}");
            Err(NVML_ERROR_UNKNOWN)
        }
    }
}

/// The NVML index behind a handle.
fn index(device: nvmlDevice_t) -> Result<usize, nvmlReturn_t> {
    let count = physical()?.device_count();
    (device as usize)
        .checked_sub(HANDLE_BASE)
        .filter(|&i| i < count)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// The fake driver's device (its CUDA ordinal) behind a handle.
fn driver_device(device: nvmlDevice_t) -> Result<usize, nvmlReturn_t> {
    Ok(order()?[index(device)?])
}

/// Physical (total, used) of a device.
fn memory(device: nvmlDevice_t) -> Result<(u64, u64), nvmlReturn_t> {
    let dev = driver_device(device)?;
    let physical = physical()?;
    let total = physical.total(dev);
    Ok((total, physical.used(dev).min(total)))
}

/// `nvmlInit_v2`.
///
/// # Safety
///
/// Safe to call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(|| {
        INIT_COUNT.fetch_add(1, Ordering::AcqRel);
        physical().map(|_| ())
    })
}

/// `nvmlShutdown`.
///
/// # Safety
///
/// Safe to call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        INIT_COUNT
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| NVML_ERROR_UNINITIALIZED)
    })
}

/// `nvmlDeviceGetCount_v2`.
///
/// # Safety
///
/// `count` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let n = physical()?.device_count() as c_uint;
        // SAFETY: NULL-checked; valid for writes per the caller.
        unsafe { count.as_mut() }
            .map(|c| *c = n)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    })
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
///
/// `device` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let count = physical()?.device_count();
        let index = index as usize;
        if index >= count {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: NULL-checked; valid for writes per the caller.
        unsafe { device.as_mut() }
            .map(|d| *d = (HANDLE_BASE + index) as nvmlDevice_t)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    })
}

/// `nvmlDeviceGetIndex`.
///
/// # Safety
///
/// `index` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let i = self::index(device)? as c_uint;
        // SAFETY: NULL-checked; valid for writes per the caller.
        unsafe { index.as_mut() }
            .map(|x| *x = i)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    })
}

/// `nvmlDeviceGetHandleByUUID`.
///
/// # Safety
///
/// `uuid` is NULL or NUL-terminated; `device` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        if uuid.is_null() || device.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL and NUL-terminated per the caller.
        let wanted = unsafe { CStr::from_ptr(uuid) }.to_bytes();
        let index = order()?
            .iter()
            .position(|&dev| uuid::uuid_string(dev).as_bytes() == wanted)
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        // SAFETY: checked non-NULL above; valid for writes per the caller.
        unsafe { device.write((HANDLE_BASE + index) as nvmlDevice_t) };
        Ok(())
    })
}

/// `nvmlDeviceGetMemoryInfo`: physical usage across every process.
///
/// # Safety
///
/// `memory` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(|| {
        let (total, used) = self::memory(device)?;
        // SAFETY: NULL-checked; valid for writes per the caller.
        let out = unsafe { memory.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        *out = nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        Ok(())
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: as v1 with `reserved` 0; `version` must be
/// `nvmlMemory_v2`.
///
/// # Safety
///
/// `memory` is NULL or valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let (total, used) = self::memory(device)?;
        // SAFETY: NULL-checked; valid for reads and writes per the caller.
        let out = unsafe { memory.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if out.version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        *out = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        Ok(())
    })
}

/// `nvmlUtilization_t`, percent.
#[repr(C)]
pub struct nvmlUtilization_t {
    gpu: c_uint,
    memory: c_uint,
}

/// This process's previous utilisation sample per device: (time, busy ns).
static SAMPLES: Mutex<[Option<(u64, u64)>; 16]> = Mutex::new([None; 16]);

/// `nvmlDeviceGetUtilizationRates`: `gpu` is the percentage of time the
/// simulated device was busy (any process's work) over the sample period,
/// which is the time since this process's previous call for the device (the
/// first call reports the time since the device's first launch). `memory`
/// is always 0.
///
/// # Safety
///
/// `utilization` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = driver_device(device)?;
        // SAFETY: NULL-checked; valid for writes per the caller.
        let out = unsafe { utilization.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let now = clock::now_ns();
        let (busy, _) = physical()?.busy(dev, now);
        let mut samples = SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
        let (since, busy_before) = samples[dev].unwrap_or((physical()?.first_launch(dev), 0));
        samples[dev] = Some((now, busy));
        let period = now.saturating_sub(since);
        let percent = ((busy - busy_before.min(busy)) * 100 + period / 2)
            .checked_div(period)
            .unwrap_or(0);
        *out = nvmlUtilization_t {
            gpu: percent.min(100) as c_uint,
            memory: 0,
        };
        Ok(())
    })
}
