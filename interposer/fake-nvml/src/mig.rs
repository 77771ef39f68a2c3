//! MIG on the fake GPUs, for testing the node agent's NVML backend.
//!
//! `FAKE_NVML_MIG` turns it on for every device: unset, MIG is not
//! supported (`NVML_ERROR_NOT_SUPPORTED`, as on a T4); `0`, the GPU is
//! MIG-capable with MIG off; `1`, MIG is on. The devices are then A100-80GB
//! (`nvmlDeviceGetName` says `FAKE_NVML_MODEL`, by default `NVIDIA
//! A100-SXM4-80GB`) with that board's GPU instance profiles, placements and
//! NVML's rules: a placement must be one the profile allows and overlap no
//! instance, a profile has at most its instance count, and a GPU instance
//! with a compute instance cannot be destroyed (`NVML_ERROR_IN_USE`). One
//! compute instance spans each GPU instance (what `nvidia-smi mig -cgi -C`
//! makes, and all the node agent makes); it is the MIG device, with its own
//! `MIG-` UUID. State lives in this process, as a real GPU's lives in the GPU.
//!
//! Also here, because the agent's backend reads them from every GPU:
//! `nvmlDeviceGetName`, `nvmlDeviceGetPciInfo_v3`, and `nvmlDeviceGetUUID`
//! (which answers for MIG device handles too).
//!
//! Structs are nvml-wrapper-sys's bindings of NVIDIA's `nvml.h`, so the
//! layouts are the real header's.

use std::ffi::{c_char, c_uint};
use std::sync::{Mutex, MutexGuard};

use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceProfileInfo_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlPciInfo_t,
};

use super::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED, driver_device, guard, index, nvmlDevice_t, nvmlReturn_t,
};
use fake_gpu::uuid;

const NVML_ERROR_IN_USE: nvmlReturn_t = 19;
const NVML_ERROR_INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;

/// Handles of GPU instances, compute instances and MIG devices: a base, the
/// device index × 256 and the GPU instance ID.
const GI_BASE: usize = 0x10_0000;
const CI_BASE: usize = 0x20_0000;
const MIG_BASE: usize = 0x30_0000;
const PER_DEVICE: usize = 256;
/// `nvmlDeviceGetMaxMigDeviceCount` on an A100.
const MAX_MIG_DEVICES: c_uint = 7;

type nvmlGpuInstance_t = *mut std::ffi::c_void;
type nvmlComputeInstance_t = *mut std::ffi::c_void;

/// One GPU instance profile of the A100-80GB.
struct Row {
    /// `NVML_GPU_INSTANCE_PROFILE_*`, the info call's argument.
    profile: c_uint,
    name: &'static str,
    id: c_uint,
    compute: c_uint,
    memory: c_uint,
    mib: u64,
    max: c_uint,
    starts: &'static [c_uint],
}

#[rustfmt::skip]
const A100_80GB: [Row; 7] = [
    Row { profile: 0, name: "1g.10gb", id: 19, compute: 1, memory: 1, mib: 9728, max: 7, starts: &[0, 1, 2, 3, 4, 5, 6] },
    Row { profile: 1, name: "2g.20gb", id: 14, compute: 2, memory: 2, mib: 19968, max: 3, starts: &[0, 2, 4] },
    Row { profile: 2, name: "3g.40gb", id: 9, compute: 3, memory: 4, mib: 40192, max: 2, starts: &[0, 4] },
    Row { profile: 3, name: "4g.40gb", id: 5, compute: 4, memory: 4, mib: 40192, max: 1, starts: &[0] },
    Row { profile: 4, name: "7g.80gb", id: 0, compute: 7, memory: 8, mib: 80896, max: 1, starts: &[0] },
    Row { profile: 7, name: "1g.10gb+me", id: 20, compute: 1, memory: 1, mib: 9728, max: 1, starts: &[0, 1, 2, 3, 4, 5, 6] },
    Row { profile: 9, name: "1g.20gb", id: 15, compute: 1, memory: 2, mib: 19968, max: 4, starts: &[0, 2, 4, 6] },
];

/// Compute slices of each `NVML_COMPUTE_INSTANCE_PROFILE_*`.
const CI_SLICES: [c_uint; 7] = [1, 2, 3, 4, 7, 8, 6];

/// A GPU instance.
struct Gi {
    device: usize,
    id: usize,
    row: usize,
    start: c_uint,
    /// The compute instance's profile, when there is one.
    ci: Option<c_uint>,
    uuid: String,
}

#[derive(Default)]
struct State {
    instances: Vec<Gi>,
    created: u64,
}

fn state() -> MutexGuard<'static, State> {
    static STATE: Mutex<State> = Mutex::new(State {
        instances: Vec::new(),
        created: 0,
    });
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `None`: not MIG-capable; `Some(on)`: capable, MIG on or off.
fn mig() -> Option<bool> {
    std::env::var("FAKE_NVML_MIG").ok().map(|v| v == "1")
}

fn enabled() -> Result<(), nvmlReturn_t> {
    match mig() {
        Some(true) => Ok(()),
        Some(false) => Err(NVML_ERROR_INVALID_ARGUMENT),
        None => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

fn row_by_id(id: c_uint) -> Result<usize, nvmlReturn_t> {
    A100_80GB
        .iter()
        .position(|r| r.id == id)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn slices(row: &Row, start: c_uint) -> u8 {
    (((1u16 << row.memory) - 1) << start) as u8
}

/// The GPU instance behind a handle of `base`.
fn find(state: &State, handle: *mut std::ffi::c_void, base: usize) -> Result<usize, nvmlReturn_t> {
    let raw = (handle as usize)
        .checked_sub(base)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let (device, id) = (raw / PER_DEVICE, raw % PER_DEVICE);
    state
        .instances
        .iter()
        .position(|g| g.device == device && g.id == id)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn handle_of(base: usize, gi: &Gi) -> *mut std::ffi::c_void {
    (base + gi.device * PER_DEVICE + gi.id) as *mut std::ffi::c_void
}

/// Writes `text` NUL-terminated into `out` of `length` bytes.
///
/// # Safety
///
/// `out` is NULL or valid for `length` bytes of writes.
unsafe fn write_str(text: &str, out: *mut c_char, length: c_uint) -> Result<(), nvmlReturn_t> {
    if out.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (length as usize) < text.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `out` is valid for `length` > text.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), out, text.len());
        out.add(text.len()).write(0);
    }
    Ok(())
}

/// The `MIG-` UUID of a MIG device handle, if `device` is one.
fn mig_uuid(device: nvmlDevice_t) -> Option<String> {
    let state = state();
    let at = find(&state, device, MIG_BASE).ok()?;
    Some(state.instances[at].uuid.clone())
}

/// `nvmlDeviceGetUUID`: `GPU-` and the UUID `cuDeviceGetUuid` reports for
/// the same device; a MIG device's `MIG-` UUID.
///
/// # Safety
///
/// `uuid` is NULL or valid for `length` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let text = match mig_uuid(device) {
            Some(mig) => mig,
            None => uuid::uuid_string(driver_device(device)?),
        };
        // SAFETY: `uuid` is NULL or valid for `length` bytes, per the caller.
        unsafe { write_str(&text, uuid, length) }
    })
}

/// Writes through `out`, refusing NULL.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), nvmlReturn_t> {
    // SAFETY: NULL-checked; valid for writes per the caller.
    unsafe { out.as_mut() }
        .map(|o| *o = value)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// `nvmlDeviceGetName`: `FAKE_NVML_MODEL`, by default `NVIDIA A100-SXM4-80GB`.
///
/// # Safety
///
/// `name` is NULL or valid for `length` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        index(device)?;
        let model =
            std::env::var("FAKE_NVML_MODEL").unwrap_or_else(|_| "NVIDIA A100-SXM4-80GB".into());
        // SAFETY: per this function's contract.
        unsafe { write_str(&model, name, length) }
    })
}

/// `nvmlDeviceGetPciInfo_v3`: bus `0000000<i>:00:00.0` for NVML index `i`.
///
/// # Safety
///
/// `pci` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let i = index(device)?;
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        let bus = format!("{:08X}:00:00.0", i + 0x100);
        for (slot, byte) in info.busId.iter_mut().zip(bus.bytes()) {
            *slot = byte as c_char;
        }
        for (slot, byte) in info.busIdLegacy.iter_mut().zip(bus[4..].bytes().take(15)) {
            *slot = byte as c_char;
        }
        info.domain = (i + 0x100) as c_uint;
        // SAFETY: per this function's contract.
        unsafe { put(pci, info) }
    })
}

/// `nvmlDeviceGetMigMode`.
///
/// # Safety
///
/// `current` and `pending` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        index(device)?;
        let on = c_uint::from(mig().ok_or(NVML_ERROR_NOT_SUPPORTED)?);
        // SAFETY: per this function's contract.
        unsafe {
            put(current, on)?;
            put(pending, on)
        }
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` (version 2: with the name).
///
/// # Safety
///
/// `info` is NULL or valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        index(device)?;
        mig().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        // SAFETY: NULL-checked; valid per the caller.
        let info = unsafe { info.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let version = size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as c_uint | (2 << 24);
        if info.version != version {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let row = A100_80GB
            .iter()
            .find(|r| r.profile == profile)
            .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        info.id = row.id;
        info.isP2pSupported = 0;
        info.sliceCount = row.compute;
        info.instanceCount = row.max;
        info.multiprocessorCount = row.compute * 14;
        info.memorySizeMB = row.mib;
        info.name = [0; 96];
        for (slot, byte) in info
            .name
            .iter_mut()
            .zip(format!("MIG {}", row.name).bytes())
        {
            *slot = byte as c_char;
        }
        Ok(())
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`.
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `placements` is NULL or
/// valid for `*count` placements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        index(device)?;
        mig().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let row = &A100_80GB[row_by_id(profile_id)?];
        // SAFETY: NULL-checked; valid per the caller.
        let count = unsafe { count.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let room = *count as usize;
        *count = row.starts.len() as c_uint;
        if placements.is_null() {
            return Ok(());
        }
        if room < row.starts.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, &start) in row.starts.iter().enumerate() {
            // SAFETY: `placements` holds `room` >= starts.len() entries.
            unsafe {
                placements.add(i).write(nvmlGpuInstancePlacement_t {
                    start,
                    size: row.memory,
                })
            };
        }
        Ok(())
    })
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`.
///
/// # Safety
///
/// `placement` is NULL or valid for reads; `instance` NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = index(device)?;
        enabled()?;
        let at = row_by_id(profile_id)?;
        let row = &A100_80GB[at];
        // SAFETY: NULL-checked; valid per the caller.
        let placement = unsafe { placement.as_ref() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if placement.size != row.memory || !row.starts.contains(&placement.start) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let mut state = state();
        let mine = || state.instances.iter().filter(|g| g.device == dev);
        let taken = mine().fold(0u8, |m, g| m | slices(&A100_80GB[g.row], g.start));
        if taken & slices(row, placement.start) != 0
            || mine().filter(|g| g.row == at).count() >= row.max as usize
        {
            return Err(NVML_ERROR_INSUFFICIENT_RESOURCES);
        }
        let id = (1..PER_DEVICE)
            .find(|id| !mine().any(|g| g.id == *id))
            .ok_or(NVML_ERROR_INSUFFICIENT_RESOURCES)?;
        state.created += 1;
        let uuid = format!(
            "MIG-5e55e4a0-fa4e-4000-8000-{:04x}{:08x}",
            dev, state.created
        );
        let gi = Gi {
            device: dev,
            id,
            row: at,
            start: placement.start,
            ci: None,
            uuid,
        };
        let handle = handle_of(GI_BASE, &gi);
        state.instances.push(gi);
        // SAFETY: per this function's contract.
        unsafe { put(instance, handle) }
    })
}

/// `nvmlGpuInstanceDestroy`: refused while a compute instance exists.
///
/// # Safety
///
/// Safe to call with any handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(instance: nvmlGpuInstance_t) -> nvmlReturn_t {
    guard(|| {
        let mut state = state();
        let at = find(&state, instance, GI_BASE)?;
        if state.instances[at].ci.is_some() {
            return Err(NVML_ERROR_IN_USE);
        }
        state.instances.remove(at);
        Ok(())
    })
}

/// `nvmlDeviceGetGpuInstances`.
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `instances` is NULL or
/// valid for `*count` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let dev = index(device)?;
        enabled()?;
        let at = row_by_id(profile_id)?;
        // SAFETY: NULL-checked; valid per the caller.
        let count = unsafe { count.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let state = state();
        let found: Vec<_> = state
            .instances
            .iter()
            .filter(|g| g.device == dev && g.row == at)
            .collect();
        if instances.is_null() || (*count as usize) < found.len() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for (i, gi) in found.iter().enumerate() {
            // SAFETY: `instances` holds `*count` >= found.len() handles.
            unsafe { instances.add(i).write(handle_of(GI_BASE, gi)) };
        }
        *count = found.len() as c_uint;
        Ok(())
    })
}

/// `nvmlGpuInstanceGetInfo`.
///
/// # Safety
///
/// `info` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let state = state();
        let gi = &state.instances[find(&state, instance, GI_BASE)?];
        let row = &A100_80GB[gi.row];
        let value = nvmlGpuInstanceInfo_t {
            device: (super::HANDLE_BASE + gi.device) as _,
            id: gi.id as c_uint,
            profileId: row.id,
            placement: nvmlGpuInstancePlacement_t {
                start: gi.start,
                size: row.memory,
            },
        };
        // SAFETY: per this function's contract.
        unsafe { put(info, value) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`: the profiles of at most
/// the GPU instance's compute slices (only the shared engine profile).
///
/// # Safety
///
/// `info` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    instance: nvmlGpuInstance_t,
    profile: c_uint,
    engine: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let state = state();
        let gi = &state.instances[find(&state, instance, GI_BASE)?];
        let compute = A100_80GB[gi.row].compute;
        let slices = *CI_SLICES
            .get(profile as usize)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if engine != 0 || slices > compute {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut value: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        value.id = profile;
        value.sliceCount = slices;
        value.instanceCount = compute / slices;
        value.multiprocessorCount = slices * 14;
        // SAFETY: per this function's contract.
        unsafe { put(info, value) }
    })
}

/// `nvmlGpuInstanceCreateComputeInstance`: one compute instance spanning
/// the GPU instance (a smaller one is refused as not supported here).
///
/// # Safety
///
/// `compute` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let mut state = state();
        let at = find(&state, instance, GI_BASE)?;
        let gi = &mut state.instances[at];
        let slices = *CI_SLICES
            .get(profile_id as usize)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if slices != A100_80GB[gi.row].compute {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        if gi.ci.is_some() {
            return Err(NVML_ERROR_INSUFFICIENT_RESOURCES);
        }
        gi.ci = Some(profile_id);
        let handle = handle_of(CI_BASE, gi);
        // SAFETY: per this function's contract.
        unsafe { put(compute, handle) }
    })
}

/// `nvmlGpuInstanceGetComputeInstances`.
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `computes` is NULL or
/// valid for `*count` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    computes: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let state = state();
        let gi = &state.instances[find(&state, instance, GI_BASE)?];
        // SAFETY: NULL-checked; valid per the caller.
        let count = unsafe { count.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let found = usize::from(gi.ci == Some(profile_id));
        if computes.is_null() || (*count as usize) < found {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if found == 1 {
            // SAFETY: `computes` holds at least one handle.
            unsafe { computes.write(handle_of(CI_BASE, gi)) };
        }
        *count = found as c_uint;
        Ok(())
    })
}

/// `nvmlComputeInstanceDestroy`.
///
/// # Safety
///
/// Safe to call with any handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(
    compute: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let mut state = state();
        let at = find(&state, compute, CI_BASE)?;
        state.instances[at]
            .ci
            .take()
            .map(|_| ())
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`.
///
/// # Safety
///
/// `count` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        index(device)?;
        mig().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        // SAFETY: per this function's contract.
        unsafe { put(count, MAX_MIG_DEVICES) }
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: the `index`-th MIG device (GPU
/// instance with a compute instance), by GPU instance ID.
///
/// # Safety
///
/// `mig_device` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    at: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let dev = index(device)?;
        enabled()?;
        let state = state();
        let mut devices: Vec<&Gi> = state
            .instances
            .iter()
            .filter(|g| g.device == dev && g.ci.is_some())
            .collect();
        devices.sort_by_key(|g| g.id);
        let gi = devices.get(at as usize).ok_or(NVML_ERROR_NOT_FOUND)?;
        // SAFETY: per this function's contract.
        unsafe { put(mig_device, handle_of(MIG_BASE, gi)) }
    })
}

/// `nvmlDeviceGetGpuInstanceId` of a MIG device.
///
/// # Safety
///
/// `id` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let state = state();
        let gi = &state.instances
            [find(&state, device, MIG_BASE).map_err(|_| NVML_ERROR_NOT_SUPPORTED)?];
        // SAFETY: per this function's contract.
        unsafe { put(id, gi.id as c_uint) }
    })
}
