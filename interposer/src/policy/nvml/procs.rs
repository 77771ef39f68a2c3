//! NVML's process queries, filtered to the container's processes.
//!
//! `nvmlDeviceGetComputeRunningProcesses` (v1, `_v2`, `_v3`), the graphics
//! and MPS lists of the same shapes, and `nvmlDeviceGetProcessUtilization`
//! list every process on the GPU, other containers' included. Inside a
//! container they answer only for the container's processes: the live slots
//! of its region, in the pid namespace the driver reports pids in (the
//! host's). A slot's pid is that pid when the process runs in the host's pid
//! namespace (checked: `/proc/self/ns/pid` is the initial namespace), else
//! its `host_pid` once the node agent has written it; a process whose host
//! pid is unknown is left out rather than guessed (pids of different
//! namespaces must not be compared). The calling process is always one of
//! the container's. Without a region (`CUDA_DISABLE_CONTROL`, or no limit and
//! no usable region) the driver's answers pass through.
//!
//! The count protocol is NVML's: the driver is asked with a buffer large
//! enough for every process, then the caller gets the filtered entries, or
//! `NVML_ERROR_INSUFFICIENT_SIZE` with the filtered count.

use std::ffi::c_uint;

use tessera_vgpu_region::process_alive;

use crate::accounting::pids::in_host_pid_namespace;
use crate::policy::process::{State, state};
use crate::sys::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_NOT_FOUND, NVML_ERROR_UNINITIALIZED, NVML_SUCCESS,
    nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t, nvmlProcessUtilizationSample_t,
    nvmlReturn_t,
};

/// The container's processes as the driver knows them (host pids), `None`
/// when there is no region to tell them by.
fn container_pids() -> Option<Vec<u32>> {
    let State::Enforcing(enforcer) = state() else {
        return None;
    };
    let region = enforcer.region()?;
    let host = in_host_pid_namespace();
    let mut pids: Vec<u32> = region
        .snapshot()
        .processes
        .into_iter()
        .filter_map(|p| match p.host_pid {
            Some(host_pid) => Some(host_pid),
            None => (host && process_alive(p.pid, p.start_time)).then_some(p.pid),
        })
        .collect();
    if host {
        pids.push(std::process::id());
    }
    Some(pids)
}

/// An NVML list query: the driver's entries whose pid is the container's.
///
/// `call(count, buffer)` asks the driver; `empty` is the answer for no
/// entry (`NVML_SUCCESS` with 0 for process lists, `NVML_ERROR_NOT_FOUND`
/// for utilisation samples).
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `out` is NULL or valid for
/// `*count` entries of writes.
unsafe fn filtered<T: Copy + Default>(
    count: *mut c_uint,
    out: *mut T,
    empty: nvmlReturn_t,
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
    pid: impl Fn(&T) -> u32,
) -> nvmlReturn_t {
    if matches!(state(), State::Refused) {
        return NVML_ERROR_UNINITIALIZED;
    }
    let Some(pids) = container_pids() else {
        return call(count, out);
    };
    // SAFETY: NULL or valid for reads and writes, per the caller.
    let Some(room) = (unsafe { count.as_mut() }).map(|c| *c as usize) else {
        // The driver's own answer for a NULL count.
        return call(count, out);
    };
    let mut all: Vec<T> = vec![T::default(); 64];
    let rc = loop {
        let mut n = all.len() as c_uint;
        let rc = call(&mut n, all.as_mut_ptr());
        if rc == NVML_ERROR_INSUFFICIENT_SIZE && n as usize > all.len() {
            // More processes than room: ask again with enough (and some
            // margin for processes that start meanwhile).
            all.resize(n as usize + 16, T::default());
            continue;
        }
        all.truncate(n as usize);
        break rc;
    };
    if rc != NVML_SUCCESS && rc != empty {
        return rc;
    }
    if rc != NVML_SUCCESS {
        all.clear();
    }
    all.retain(|entry| pids.contains(&pid(entry)));
    // SAFETY: checked non-NULL above.
    unsafe { *count = all.len() as c_uint };
    if all.is_empty() {
        return empty;
    }
    if out.is_null() || room < all.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: `out` has room for `room` >= all.len() entries, per the caller.
    unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), out, all.len()) };
    NVML_SUCCESS
}

macro_rules! process_list {
    ($name:ident, $real:ident, $info:ty) => {
        #[doc = concat!("`", stringify!($real), "`: the container's processes only.")]
        ///
        /// # Safety
        ///
        /// `count` is NULL or valid for reads and writes; `infos` is NULL or
        /// valid for `*count` entries.
        pub(crate) unsafe fn $name(
            device: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut $info,
        ) -> nvmlReturn_t {
            let call = |n, buffer| real_nvml!($real(device, n, buffer));
            // SAFETY: the caller's pointers, as documented.
            unsafe { filtered(count, infos, NVML_SUCCESS, call, |info| info.pid) }
        }
    };
}

process_list!(
    compute_processes,
    nvmlDeviceGetComputeRunningProcesses,
    nvmlProcessInfo_v1_t
);
process_list!(
    compute_processes_v2,
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlProcessInfo_t
);
process_list!(
    compute_processes_v3,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlProcessInfo_t
);
process_list!(
    graphics_processes,
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlProcessInfo_v1_t
);
process_list!(
    graphics_processes_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlProcessInfo_t
);
process_list!(
    graphics_processes_v3,
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlProcessInfo_t
);
process_list!(
    mps_processes,
    nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlProcessInfo_v1_t
);
process_list!(
    mps_processes_v2,
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlProcessInfo_t
);
process_list!(
    mps_processes_v3,
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
    nvmlProcessInfo_t
);

/// `nvmlDeviceGetProcessUtilization`: the container's processes' samples
/// only (`NVML_ERROR_NOT_FOUND` when none of them ran).
///
/// # Safety
///
/// `samples` is NULL or valid for `*count` entries; `count` is NULL or valid
/// for reads and writes.
pub(crate) unsafe fn process_utilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    let call = |n, buffer| {
        real_nvml!(nvmlDeviceGetProcessUtilization(
            device, buffer, n, last_seen
        ))
    };
    // SAFETY: the caller's pointers, as documented.
    unsafe {
        filtered(count, samples, NVML_ERROR_NOT_FOUND, call, |sample| {
            sample.pid
        })
    }
}
