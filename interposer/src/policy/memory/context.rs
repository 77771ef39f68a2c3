//! Contexts: each context a process makes takes device memory (its
//! footprint: the driver's per-context state, local memory, printf and heap
//! reservations), charged to its device while it exists.
//!
//! The footprint is **measured**: the device's used memory is read just
//! before and just after the driver makes the context, and the difference
//! is charged. The reading comes from `cuMemGetInfo_v2` when the calling
//! thread's current context is on the same device (a second context, or a
//! primary context retained while another is current), else from NVML
//! (`nvmlDeviceGetMemoryInfo` of the NVML device with the ordinal's UUID,
//! or the NVML index equal to the ordinal where UUIDs are unreadable);
//! without either, the last footprint measured on that device in this
//! process is charged (0 at first, with a warning). The last measured footprint is also reserved
//! before the driver is called, so that contexts made concurrently by
//! several processes of the container cannot overcommit together; the
//! reservation is then corrected to the measurement, and a context whose
//! footprint no longer fits is destroyed and refused with
//! `CUDA_ERROR_OUT_OF_MEMORY`.
//!
//! Measurements in one process are serialised (a lock held across the
//! driver call, which never calls back into the hooks); memory that other
//! processes take or free in that window shows in the difference, so a
//! footprint can be overcharged (concurrent allocations) or undercharged
//! (concurrent frees) by what moved meanwhile.
//!
//! `cuCtxCreate_v2`, `_v3` and `_v4` contexts are charged until
//! `cuCtxDestroy_v2`; a device's primary context from the retain that makes
//! it (the process's first `cuDevicePrimaryCtxRetain`) until the
//! `cuDevicePrimaryCtxRelease_v2` that drops its retain count to zero.

use std::ffi::{c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

use tessera_vgpu_region::MAX_DEVICES;

use crate::accounting::enforcer::Enforcer;
use crate::accounting::keys::Key;
use crate::driver::queries::current_device;
use crate::log::{DEBUG, WARN};
use crate::policy::memory::alloc::release_key;
use crate::policy::process::enforcer_or_return;
use crate::sys::{
    CUDA_SUCCESS, CUcontext, CUdevice, CUresult, NVML_ERROR_INSUFFICIENT_SIZE, NVML_SUCCESS,
    nvmlDevice_t, nvmlMemory_t, nvmlProcessInfo_t,
};

/// Per-process context bookkeeping, locked across a measured creation.
struct Contexts {
    /// Retains of each device's primary context by this process.
    primary: [u32; MAX_DEVICES],
    /// The last footprint measured on each device.
    footprint: [u64; MAX_DEVICES],
    /// NVML was initialised (`Some(true)`) or cannot be (`Some(false)`).
    nvml: Option<bool>,
    /// A footprint could not be measured and this was said.
    warned: bool,
}

static CONTEXTS: Mutex<Contexts> = Mutex::new(Contexts {
    primary: [0; MAX_DEVICES],
    footprint: [0; MAX_DEVICES],
    nvml: None,
    warned: false,
});

fn lock() -> MutexGuard<'static, Contexts> {
    CONTEXTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a device's used memory is read.
#[derive(Clone, Copy, Debug)]
enum Gauge {
    /// What NVML's process list says this process (host pid) holds on this
    /// NVML device: other processes' allocations do not move it.
    Process(usize, u32),
    /// `cuMemGetInfo_v2` in the calling thread's current context: the whole
    /// device.
    MemGetInfo,
    /// `nvmlDeviceGetMemoryInfo` of this NVML device: the whole device.
    Device(usize),
}

/// NVML's "not available" for a process's memory (no permission, MIG, WSL).
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

impl Contexts {
    /// How to read the memory a new context on `dev` takes, best first: this
    /// process's usage from NVML, else the device's from `cuMemGetInfo_v2`
    /// (a current context on `dev`), else the device's from NVML.
    fn gauge(&mut self, enforcer: &Enforcer, dev: CUdevice) -> Option<Gauge> {
        let fns = &crate::driver::nvml::nvml().fns;
        let nvml = *self.nvml.get_or_insert_with(|| {
            fns.nvmlInit_v2.is_some()
                && fns.nvmlDeviceGetHandleByIndex_v2.is_some()
                && real_nvml!(nvmlInit_v2()) == NVML_SUCCESS
        });
        // The NVML device with the ordinal's UUID, else (UUIDs unreadable)
        // the NVML index equal to the ordinal.
        let device = nvml
            .then(|| {
                crate::driver::devices::nvml_device(usize::try_from(dev).ok()?).or_else(|| {
                    let index = c_uint::try_from(dev).ok()?;
                    let mut device: nvmlDevice_t = std::ptr::null_mut();
                    (real_nvml!(nvmlDeviceGetHandleByIndex_v2(index, &mut device)) == NVML_SUCCESS)
                        .then_some(device)
                })
            })
            .flatten()
            .map(|d| d as usize);
        if let (Some(device), Some(pid)) = (device, host_pid(enforcer))
            && (fns.nvmlDeviceGetComputeRunningProcesses_v3.is_some()
                || fns.nvmlDeviceGetComputeRunningProcesses_v2.is_some())
            && Self::used(Gauge::Process(device, pid)).is_some()
        {
            return Some(Gauge::Process(device, pid));
        }
        if current_device() == Ok(dev) {
            return Some(Gauge::MemGetInfo);
        }
        device.map(Gauge::Device)
    }

    /// The memory `gauge` reads.
    fn used(gauge: Gauge) -> Option<u64> {
        match gauge {
            Gauge::Process(device, pid) => process_used(device as nvmlDevice_t, pid),
            Gauge::MemGetInfo => {
                let (mut free, mut total) = (0usize, 0usize);
                (real!(cuMemGetInfo_v2(&mut free, &mut total)) == CUDA_SUCCESS)
                    .then(|| total.saturating_sub(free) as u64)
            }
            Gauge::Device(device) => {
                let mut memory = nvmlMemory_t {
                    total: 0,
                    free: 0,
                    used: 0,
                };
                let device = device as nvmlDevice_t;
                (real_nvml!(nvmlDeviceGetMemoryInfo(device, &mut memory)) == NVML_SUCCESS)
                    .then_some(memory.used)
            }
        }
    }

    /// Makes a context with `create` (which returns it) and charges its
    /// measured footprint to `key(context)`; `destroy` undoes it when the
    /// footprint does not fit. Called with the lock held.
    fn charge(
        &mut self,
        enforcer: &Enforcer,
        dev: CUdevice,
        key: impl FnOnce(u64) -> Key,
        create: impl FnOnce() -> Result<u64, CUresult>,
        destroy: impl FnOnce(u64),
    ) -> CUresult {
        let Some(index) = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES) else {
            return create().err().unwrap_or(CUDA_SUCCESS);
        };
        let gauge = self.gauge(enforcer, dev);
        let before = gauge.and_then(Self::used);
        let estimate = self.footprint[index];
        let mut reservation = match enforcer.reserve_for(dev, estimate) {
            Ok(Some(r)) => r,
            Ok(None) => return create().err().unwrap_or(CUDA_SUCCESS),
            Err(rc) => return rc,
        };
        let ctx = match create() {
            Ok(ctx) => ctx,
            Err(rc) => {
                enforcer.cancel(reservation);
                return rc;
            }
        };
        let after = gauge.and_then(Self::used);
        let footprint = match (before, after) {
            (Some(before), Some(after)) => after.saturating_sub(before),
            _ => {
                if !self.warned {
                    self.warned = true;
                    log!(
                        WARN,
                        "device {dev}: cannot measure a context's footprint (no current context there and no NVML); charging {estimate} bytes"
                    );
                }
                estimate
            }
        };
        log!(
            DEBUG,
            "device {dev}: context footprint {footprint} bytes ({gauge:?})"
        );
        self.footprint[index] = footprint;
        if let Err(rc) = enforcer.resize(&mut reservation, footprint) {
            enforcer.cancel(reservation);
            destroy(ctx);
            return rc;
        }
        enforcer.track(key(ctx), reservation);
        CUDA_SUCCESS
    }
}

/// Makes a new context with `call`, which writes it to `pctx`.
///
/// # Safety
///
/// `pctx` is what `call` writes.
unsafe fn create_context(
    pctx: *mut CUcontext,
    dev: CUdevice,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let enforcer = enforcer_or_return!(call());
    lock().charge(
        enforcer,
        dev,
        Key::Context,
        || match call() {
            // SAFETY: the driver succeeded, so `pctx` is valid and written.
            CUDA_SUCCESS => Ok(unsafe { *pctx } as u64),
            rc => Err(rc),
        },
        |ctx| {
            real!(cuCtxDestroy_v2(ctx as CUcontext));
        },
    )
}

/// `cuCtxCreate_v2`, charged the context's measured footprint.
///
/// # Safety
///
/// As for `cuCtxCreate_v2`.
pub(crate) unsafe fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let call = || real!(cuCtxCreate_v2(pctx, flags, dev));
    // SAFETY: `pctx` is the caller's, which `call` writes.
    unsafe { create_context(pctx, dev, call) }
}

/// `cuCtxCreate_v3` (execution affinity), charged like `cuCtxCreate_v2`.
///
/// # Safety
///
/// As for `cuCtxCreate_v3`.
pub(crate) unsafe fn ctx_create_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    count: std::ffi::c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let call = || real!(cuCtxCreate_v3(pctx, params, count, flags, dev));
    // SAFETY: `pctx` is the caller's, which `call` writes.
    unsafe { create_context(pctx, dev, call) }
}

/// `cuCtxCreate_v4` (creation parameters), charged like `cuCtxCreate_v2`.
///
/// # Safety
///
/// As for `cuCtxCreate_v4`.
pub(crate) unsafe fn ctx_create_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let call = || real!(cuCtxCreate_v4(pctx, params, flags, dev));
    // SAFETY: `pctx` is the caller's, which `call` writes.
    unsafe { create_context(pctx, dev, call) }
}

/// `cuCtxDestroy_v2`: destroys, then returns the context's charge.
///
/// # Safety
///
/// None beyond `cuCtxDestroy_v2`'s.
pub(crate) unsafe fn ctx_destroy(ctx: CUcontext) -> CUresult {
    release_key(Key::Context(ctx as u64), || real!(cuCtxDestroy_v2(ctx)))
}

/// `cuDevicePrimaryCtxRetain`: the retain that makes the device's primary
/// context in this process is charged its measured footprint.
///
/// # Safety
///
/// As for `cuDevicePrimaryCtxRetain`.
pub(crate) unsafe fn primary_ctx_retain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let enforcer = enforcer_or_return!(real!(cuDevicePrimaryCtxRetain(pctx, dev)));
    let Some(index) = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES) else {
        return real!(cuDevicePrimaryCtxRetain(pctx, dev));
    };
    let mut contexts = lock();
    if contexts.primary[index] > 0 {
        let rc = real!(cuDevicePrimaryCtxRetain(pctx, dev));
        if rc == CUDA_SUCCESS {
            contexts.primary[index] += 1;
        }
        return rc;
    }
    let mut retained = false;
    let rc = contexts.charge(
        enforcer,
        dev,
        |_| Key::Primary(index as u64),
        || match real!(cuDevicePrimaryCtxRetain(pctx, dev)) {
            CUDA_SUCCESS => {
                retained = true;
                Ok(index as u64)
            }
            rc => Err(rc),
        },
        |_| {
            real!(cuDevicePrimaryCtxRelease_v2(dev));
        },
    );
    if rc == CUDA_SUCCESS && retained {
        contexts.primary[index] = 1;
    }
    rc
}

/// `cuDevicePrimaryCtxRelease_v2`: the release that drops this process's
/// retain count to zero (the driver destroys the context) returns its
/// charge.
///
/// # Safety
///
/// None beyond `cuDevicePrimaryCtxRelease_v2`'s.
pub(crate) unsafe fn primary_ctx_release(dev: CUdevice) -> CUresult {
    let enforcer = enforcer_or_return!(real!(cuDevicePrimaryCtxRelease_v2(dev)));
    let Some(index) = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES) else {
        return real!(cuDevicePrimaryCtxRelease_v2(dev));
    };
    let mut contexts = lock();
    let rc = real!(cuDevicePrimaryCtxRelease_v2(dev));
    if rc == CUDA_SUCCESS && contexts.primary[index] > 0 {
        contexts.primary[index] -= 1;
        if contexts.primary[index] == 0 {
            enforcer.freed(Key::Primary(index as u64), || CUDA_SUCCESS);
        }
    }
    rc
}

/// This process's pid as the driver reports it (the host's): its own in the
/// host's pid namespace, else the slot's `host_pid` once the node agent
/// wrote it; `None` when unknown.
fn host_pid(enforcer: &Enforcer) -> Option<u32> {
    if crate::accounting::pids::in_host_pid_namespace() {
        return Some(std::process::id());
    }
    let pid = std::process::id();
    enforcer
        .region()?
        .snapshot()
        .processes
        .into_iter()
        .find(|p| p.pid == pid)?
        .host_pid
}

/// Device memory process `pid` holds on NVML device `device` (0 when it is
/// not listed, i.e. has no context there yet), from the compute process
/// list; `None` when NVML cannot say.
fn process_used(device: nvmlDevice_t, pid: u32) -> Option<u64> {
    let fns = &crate::driver::nvml::nvml().fns;
    let mut infos = vec![nvmlProcessInfo_t::default(); 64];
    for _ in 0..2 {
        let mut count = infos.len() as c_uint;
        let rc = if fns.nvmlDeviceGetComputeRunningProcesses_v3.is_some() {
            real_nvml!(nvmlDeviceGetComputeRunningProcesses_v3(
                device,
                &mut count,
                infos.as_mut_ptr()
            ))
        } else {
            real_nvml!(nvmlDeviceGetComputeRunningProcesses_v2(
                device,
                &mut count,
                infos.as_mut_ptr()
            ))
        };
        match rc {
            NVML_SUCCESS => {
                let own = infos.iter().take(count as usize).filter(|i| i.pid == pid);
                let mut bytes: u64 = 0;
                for info in own {
                    if info.used_gpu_memory == NVML_VALUE_NOT_AVAILABLE {
                        return None;
                    }
                    bytes = bytes.saturating_add(info.used_gpu_memory);
                }
                return Some(bytes);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => infos.resize(count as usize + 16, Default::default()),
            _ => return None,
        }
    }
    None
}
