//! Process queries, from the fake driver's per-process accounting
//! (`fake-gpu/src/procs.rs`): which processes use a device and how much
//! memory each holds, and how busy each kept the device.

use std::ffi::c_uint;

use fake_gpu::{clock, procs};

use crate::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED, driver_device, guard, nvmlDevice_t, nvmlReturn_t,
};

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_v1_t {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`), which the `_v2` and `_v3`
/// functions fill.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_t {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

const _: () = assert!(size_of::<nvmlProcessInfo_v1_t>() == 16);
const _: () = assert!(size_of::<nvmlProcessInfo_t>() == 24);

/// `NVML_VALUE_NOT_AVAILABLE` in `gpuInstanceId`/`computeInstanceId`: no MIG.
const NOT_AVAILABLE: c_uint = 0xffff_ffff;

/// Fills `out` (room for `*count` entries) NVML's way: with fewer entries
/// than there are, `*count` becomes the number needed and the answer is
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `out` is NULL or valid for
/// `*count` entries of writes.
unsafe fn fill<T>(count: *mut c_uint, out: *mut T, entries: Vec<T>) -> Result<(), nvmlReturn_t> {
    // SAFETY: NULL-checked; valid per the caller.
    let count = unsafe { count.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let room = *count as usize;
    *count = entries.len() as c_uint;
    if entries.is_empty() {
        return Ok(());
    }
    if out.is_null() || room < entries.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, entry) in entries.into_iter().enumerate() {
        // SAFETY: i < room entries, valid for writes per the caller.
        unsafe { out.add(i).write(entry) };
    }
    Ok(())
}

/// The processes using the device behind `device`, and their memory.
fn running(device: nvmlDevice_t) -> Result<Vec<(u32, u64)>, nvmlReturn_t> {
    let dev = driver_device(device)?;
    Ok(procs::procs().map_or_else(Vec::new, |p| p.processes(dev)))
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 entries): every live process
/// that took memory or launched work on the device, with the memory it holds.
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `infos` is NULL or valid
/// for `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    guard(|| {
        let entries = running(device)?
            .into_iter()
            .map(|(pid, used)| nvmlProcessInfo_v1_t {
                pid,
                used_gpu_memory: used,
            })
            .collect();
        // SAFETY: the caller's pointers, as documented.
        unsafe { fill(count, infos, entries) }
    })
}

fn running_v2(device: nvmlDevice_t) -> Result<Vec<nvmlProcessInfo_t>, nvmlReturn_t> {
    Ok(running(device)?
        .into_iter()
        .map(|(pid, used)| nvmlProcessInfo_t {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: NOT_AVAILABLE,
            compute_instance_id: NOT_AVAILABLE,
        })
        .collect())
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`: as v1, with `nvmlProcessInfo_t`.
///
/// # Safety
///
/// As v1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's pointers, as documented.
    guard(|| unsafe { fill(count, infos, running_v2(device)?) })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`: as `_v2`.
///
/// # Safety
///
/// As v1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's pointers, as documented.
    guard(|| unsafe { fill(count, infos, running_v2(device)?) })
}

/// How many sample periods back `nvmlDeviceGetProcessUtilization` reaches.
const SAMPLES_KEPT: u64 = 32;

/// The driver's sample period, ns (`FAKE_NVML_SAMPLE_PERIOD_MS`, 200 unless
/// set to a whole number of milliseconds from 1).
fn sample_period_ns() -> u64 {
    std::env::var("FAKE_NVML_SAMPLE_PERIOD_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .unwrap_or(200)
        * 1_000_000
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessUtilizationSample_t {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

const _: () = assert!(size_of::<nvmlProcessUtilizationSample_t>() == 32);

/// `CLOCK_REALTIME` in nanoseconds: NVML's sample timestamps are CPU time
/// in microseconds.
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `nvmlDeviceGetProcessUtilization`, sampled as a real driver samples: on
/// its own clock, every `FAKE_NVML_SAMPLE_PERIOD_MS` (200 unless set: an H100
/// with driver 580 takes one every 200 ms), at the multiples of the period
/// on `CLOCK_REALTIME`. Each sample has `timeStamp` = its time (µs) and, for
/// each process whose work ran on the device in the period before it,
/// `smUtil` = the percentage of that period the work occupied the device,
/// rounded. It returns the samples newer than `last_seen` (µs; 0: the newest
/// only), as far back as [`SAMPLES_KEPT`] periods and the driver's record
/// of runs (its last 4096 per device) reach; `NVML_ERROR_NOT_FOUND` when
/// there are none, as between two samples. With
/// `FAKE_NVML_NO_PROCESS_UTILIZATION` set: `NVML_ERROR_NOT_SUPPORTED`, as on
/// GPUs without per-process accounting.
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `samples` is NULL or
/// valid for `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    guard(|| {
        let dev = driver_device(device)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if std::env::var_os("FAKE_NVML_NO_PROCESS_UTILIZATION").is_some() {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let now = clock::now_ns();
        let real = realtime_ns();
        let period = sample_period_ns();
        let newest = real / period * period;
        let oldest = if last_seen == 0 {
            newest
        } else {
            // The first sample after `last_seen`, within what is kept.
            let after = (last_seen.saturating_mul(1000) / period + 1).saturating_mul(period);
            after.max(newest.saturating_sub((SAMPLES_KEPT - 1) * period))
        };
        let Some(procs) = procs::procs() else {
            return Err(NVML_ERROR_NOT_FOUND);
        };
        let mut entries = Vec::new();
        let mut at = oldest;
        while at <= newest {
            // The sample's period on the runs' clock (monotonic).
            let end = at.saturating_sub(real.saturating_sub(now));
            for (pid, ns) in procs.busy(dev, end.saturating_sub(period), end) {
                entries.push(nvmlProcessUtilizationSample_t {
                    pid,
                    time_stamp: at / 1000,
                    sm_util: ((ns * 100 + period / 2) / period).min(100) as c_uint,
                    mem_util: 0,
                    enc_util: 0,
                    dec_util: 0,
                });
            }
            at += period;
        }
        if entries.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        // SAFETY: the caller's pointers, as documented.
        unsafe { fill(count, samples, entries) }
    })
}
