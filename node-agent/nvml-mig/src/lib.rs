//! NVML's MIG calls that nvml-wrapper 0.12 has no safe method for: a GPU's
//! instance profiles with their placements, its GPU instances with the MIG
//! device (UUID) of each, and creating (GPU instance at a placement plus one
//! compute instance spanning it) and destroying instances.
//!
//! The calls go through nvml-wrapper's own loaded library
//! ([`nvml_wrapper::Nvml::lib`]) and raw device handle, the way its safe
//! methods make them: each symbol is looked up with `nvml_sym` (a driver
//! without it is an error, never a panic) and each return code checked with
//! `nvml_try`. This crate is the only place in the node agent with `unsafe`;
//! every block says why it is sound.
//!
//! Profiles are probed by NVML's profile enums
//! (`NVML_GPU_INSTANCE_PROFILE_*`): the info call takes the enum, every
//! other call the profile's `id` (19 for `1g.10gb` on an A100), and the
//! name comes from the versioned info call (`MIG 1g.10gb`).

#![allow(unsafe_code)] // FFI into NVML; every block carries a SAFETY comment
#![deny(clippy::undocumented_unsafe_blocks)]

use std::{ffi::CStr, mem, os::raw::c_uint, ptr};

use nvml_wrapper::{
    Device,
    error::{NvmlError, nvml_sym, nvml_try},
};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: the GPU instance profile enums probed.
const GI_PROFILE_ENUMS: c_uint = 13;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
const CI_PROFILE_ENUMS: c_uint = 8;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_SHARED: c_uint = 0;
/// No GPU has more than this many instances of one profile, or MIG devices.
const MAX_INSTANCES: usize = 8;
/// `nvmlGpuInstanceProfileInfo_v2`: the struct's size, version 2 in the top byte.
const GI_PROFILE_INFO_V2: c_uint =
    mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as c_uint | (2 << 24);

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An NVML call failed.
    #[error("{call}: {source}")]
    Nvml {
        /// The NVML function.
        call: &'static str,
        /// Its error.
        #[source]
        source: NvmlError,
    },
    /// The GPU has no MIG device with this UUID.
    #[error("no MIG instance {0} on this GPU")]
    NotFound(String),
    /// A call answered what it must not (e.g. a compute slice count no
    /// compute profile has).
    #[error("{0}")]
    Unexpected(String),
}

fn failed(call: &'static str) -> impl FnOnce(NvmlError) -> Error {
    move |source| Error::Nvml { call, source }
}

/// A GPU instance profile as the GPU reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// `1g.10gb`, `1g.10gb+me`.
    pub name: String,
    /// The profile ID (`nvidia-smi mig -lgip`'s ID column).
    pub id: u32,
    /// Compute slices (`sliceCount`).
    pub compute_slices: u32,
    /// Memory slices one instance occupies (its placements' size).
    pub memory_slices: u32,
    /// `memorySizeMB`.
    pub memory_mib: u64,
    /// Most instances of the profile on the GPU.
    pub max_instances: u32,
    /// First memory slice of each allowed placement.
    pub placements: Vec<u32>,
}

/// A GPU instance (with its compute instance) as it exists on the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// The GPU instance's profile ID.
    pub profile_id: u32,
    /// The GPU instance ID.
    pub gpu_instance_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
    /// The MIG device's UUID (`MIG-…`); `None` while it has no compute
    /// instance (no MIG device exists then).
    pub uuid: Option<String>,
}

/// The device's raw handle.
fn handle(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: the handle is only passed to NVML calls while `device` (and
    // the library it came from) is borrowed, as nvml-wrapper itself does.
    unsafe { device.handle() }
}

/// Whether MIG mode is on now (`current`) and after the next reset (`pending`).
pub fn mig_mode(device: &Device<'_>) -> Result<(bool, bool), Error> {
    let mode = device.mig_mode().map_err(failed("nvmlDeviceGetMigMode"))?;
    Ok((mode.current == 1, mode.pending == 1))
}

/// Every GPU instance profile the GPU supports, with its placements.
pub fn profiles(device: &Device<'_>) -> Result<Vec<Profile>, Error> {
    let lib = device.nvml().lib();
    let info_call = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref())
        .map_err(failed("nvmlDeviceGetGpuInstanceProfileInfoV"))?;
    let placements_call = nvml_sym(lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref())
        .map_err(failed("nvmlDeviceGetGpuInstancePossiblePlacements_v2"))?;
    let mut profiles = Vec::new();
    for profile in 0..GI_PROFILE_ENUMS {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        info.version = GI_PROFILE_INFO_V2;
        // SAFETY: a valid handle and a pointer to a struct of the version we say.
        match nvml_try(unsafe { info_call(handle(device), profile, &mut info) }) {
            Ok(()) => {}
            // Profiles this GPU does not have.
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(failed("nvmlDeviceGetGpuInstanceProfileInfoV")(e)),
        }
        let mut found = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; MAX_INSTANCES];
        let mut count = MAX_INSTANCES as c_uint;
        // SAFETY: `found` holds `count` placements, which NVML fills up to `count`.
        nvml_try(unsafe {
            placements_call(handle(device), info.id, found.as_mut_ptr(), &mut count)
        })
        .map_err(failed("nvmlDeviceGetGpuInstancePossiblePlacements_v2"))?;
        let found = &found[..(count as usize).min(MAX_INSTANCES)];
        // SAFETY: NVML writes a NUL-terminated name into the 96 bytes; the
        // last byte is forced to NUL so the read stays inside them.
        let name = unsafe {
            info.name[info.name.len() - 1] = 0;
            CStr::from_ptr(info.name.as_ptr())
        }
        .to_string_lossy();
        profiles.push(Profile {
            name: name.trim_start_matches("MIG ").to_owned(),
            id: info.id,
            compute_slices: info.sliceCount,
            memory_slices: found.first().map_or(0, |p| p.size),
            memory_mib: info.memorySizeMB,
            max_instances: info.instanceCount,
            placements: found.iter().map(|p| p.start).collect(),
        });
    }
    Ok(profiles)
}

/// The GPU instances of `profiles` on the GPU, each with its MIG device's UUID.
pub fn instances(device: &Device<'_>, profiles: &[Profile]) -> Result<Vec<Instance>, Error> {
    let uuids = mig_devices(device)?;
    let mut instances = Vec::new();
    for profile in profiles {
        for gi in gpu_instances(device, profile.id)? {
            let info = gpu_instance_info(device, gi)?;
            instances.push(Instance {
                profile_id: info.profileId,
                gpu_instance_id: info.id,
                start: info.placement.start,
                size: info.placement.size,
                uuid: uuids
                    .iter()
                    .find(|(id, _)| *id == info.id)
                    .map(|(_, uuid)| uuid.clone()),
            });
        }
    }
    Ok(instances)
}

/// Creates a GPU instance of `profile` at `start` and one compute instance
/// spanning it, as `nvidia-smi mig -cgi <id> -C` does; returns it with its
/// MIG device's UUID.
pub fn create(device: &Device<'_>, profile: &Profile, start: u32) -> Result<Instance, Error> {
    let lib = device.nvml().lib();
    let create_gi = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())
        .map_err(failed("nvmlDeviceCreateGpuInstanceWithPlacement"))?;
    let placement = nvmlGpuInstancePlacement_t {
        start,
        size: profile.memory_slices,
    };
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: a valid handle, a placement that outlives the call and a place
    // for the new instance's handle.
    nvml_try(unsafe { create_gi(handle(device), profile.id, &placement, &mut gi) })
        .map_err(failed("nvmlDeviceCreateGpuInstanceWithPlacement"))?;
    let made = create_compute_instance(device, gi, profile.compute_slices);
    if let Err(error) = made {
        // Leave no half-made instance behind.
        let _ = destroy_gpu_instance(device, gi);
        return Err(error);
    }
    let info = gpu_instance_info(device, gi)?;
    let uuid = mig_devices(device)?
        .into_iter()
        .find(|(id, _)| *id == info.id)
        .map(|(_, uuid)| uuid);
    Ok(Instance {
        profile_id: info.profileId,
        gpu_instance_id: info.id,
        start: info.placement.start,
        size: info.placement.size,
        uuid,
    })
}

/// Destroys the instance whose MIG device is `uuid`: its compute
/// instances, then the GPU instance.
pub fn destroy(device: &Device<'_>, profiles: &[Profile], uuid: &str) -> Result<(), Error> {
    let id = mig_devices(device)?
        .into_iter()
        .find(|(_, u)| u == uuid)
        .map(|(id, _)| id)
        .ok_or_else(|| Error::NotFound(uuid.to_owned()))?;
    for profile in profiles {
        for gi in gpu_instances(device, profile.id)? {
            if gpu_instance_info(device, gi)?.id == id {
                return destroy_gpu_instance(device, gi);
            }
        }
    }
    Err(Error::NotFound(uuid.to_owned()))
}

/// The compute instance profile enum with `slices` compute slices.
fn ci_profile_enum(slices: u32) -> Option<c_uint> {
    Some(match slices {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => return None,
    })
}

fn create_compute_instance(
    device: &Device<'_>,
    gi: nvmlGpuInstance_t,
    slices: u32,
) -> Result<(), Error> {
    let lib = device.nvml().lib();
    let info_call = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
        .map_err(failed("nvmlGpuInstanceGetComputeInstanceProfileInfo"))?;
    let create_ci = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())
        .map_err(failed("nvmlGpuInstanceCreateComputeInstance"))?;
    let profile = ci_profile_enum(slices).ok_or_else(|| {
        Error::Unexpected(format!("no compute instance profile has {slices} slices"))
    })?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `gi` is a live GPU instance handle NVML gave us; `info` is ours.
    nvml_try(unsafe { info_call(gi, profile, CI_ENGINE_SHARED, &mut info) })
        .map_err(failed("nvmlGpuInstanceGetComputeInstanceProfileInfo"))?;
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: as above; `ci` receives the new handle.
    nvml_try(unsafe { create_ci(gi, info.id, &mut ci) })
        .map_err(failed("nvmlGpuInstanceCreateComputeInstance"))
}

fn destroy_gpu_instance(device: &Device<'_>, gi: nvmlGpuInstance_t) -> Result<(), Error> {
    let lib = device.nvml().lib();
    let info_call = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
        .map_err(failed("nvmlGpuInstanceGetComputeInstanceProfileInfo"))?;
    let list = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())
        .map_err(failed("nvmlGpuInstanceGetComputeInstances"))?;
    let destroy_ci = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())
        .map_err(failed("nvmlComputeInstanceDestroy"))?;
    let destroy_gi =
        nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref()).map_err(failed("nvmlGpuInstanceDestroy"))?;
    for profile in 0..CI_PROFILE_ENUMS {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
        // SAFETY: `gi` is a live GPU instance handle; `info` is ours.
        if nvml_try(unsafe { info_call(gi, profile, CI_ENGINE_SHARED, &mut info) }).is_err() {
            continue;
        }
        let mut cis: [nvmlComputeInstance_t; MAX_INSTANCES] = [ptr::null_mut(); MAX_INSTANCES];
        let mut count = MAX_INSTANCES as c_uint;
        // SAFETY: `cis` holds `count` handles, which NVML fills up to `count`.
        nvml_try(unsafe { list(gi, info.id, cis.as_mut_ptr(), &mut count) })
            .map_err(failed("nvmlGpuInstanceGetComputeInstances"))?;
        for &ci in &cis[..(count as usize).min(MAX_INSTANCES)] {
            // SAFETY: a compute instance handle NVML just listed.
            nvml_try(unsafe { destroy_ci(ci) }).map_err(failed("nvmlComputeInstanceDestroy"))?;
        }
    }
    // SAFETY: a live GPU instance handle, now without compute instances.
    nvml_try(unsafe { destroy_gi(gi) }).map_err(failed("nvmlGpuInstanceDestroy"))
}

fn gpu_instances(device: &Device<'_>, profile_id: u32) -> Result<Vec<nvmlGpuInstance_t>, Error> {
    let list = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuInstances.as_ref())
        .map_err(failed("nvmlDeviceGetGpuInstances"))?;
    let mut found: [nvmlGpuInstance_t; MAX_INSTANCES] = [ptr::null_mut(); MAX_INSTANCES];
    let mut count = MAX_INSTANCES as c_uint;
    // SAFETY: `found` holds `count` handles, which NVML fills up to `count`.
    nvml_try(unsafe { list(handle(device), profile_id, found.as_mut_ptr(), &mut count) })
        .map_err(failed("nvmlDeviceGetGpuInstances"))?;
    Ok(found[..(count as usize).min(MAX_INSTANCES)].to_vec())
}

fn gpu_instance_info(
    device: &Device<'_>,
    gi: nvmlGpuInstance_t,
) -> Result<nvmlGpuInstanceInfo_t, Error> {
    let call = nvml_sym(device.nvml().lib().nvmlGpuInstanceGetInfo.as_ref())
        .map_err(failed("nvmlGpuInstanceGetInfo"))?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: a GPU instance handle NVML gave us; `info` is ours.
    nvml_try(unsafe { call(gi, &mut info) }).map_err(failed("nvmlGpuInstanceGetInfo"))?;
    Ok(info)
}

/// The GPU's MIG devices as (GPU instance ID, UUID).
fn mig_devices(device: &Device<'_>) -> Result<Vec<(u32, String)>, Error> {
    let gi_id = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuInstanceId.as_ref())
        .map_err(failed("nvmlDeviceGetGpuInstanceId"))?;
    let slots = device
        .mig_device_count()
        .map_err(failed("nvmlDeviceGetMaxMigDeviceCount"))?;
    let mut devices = Vec::new();
    for index in 0..slots {
        let mig = match device.mig_device_by_index(index) {
            Ok(mig) => mig,
            // An empty slot.
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(failed("nvmlDeviceGetMigDeviceHandleByIndex")(e)),
        };
        let mut id: c_uint = 0;
        // SAFETY: a MIG device handle NVML just gave us; `id` is ours.
        nvml_try(unsafe { gi_id(mig.handle(), &mut id) })
            .map_err(failed("nvmlDeviceGetGpuInstanceId"))?;
        devices.push((id, mig.uuid().map_err(failed("nvmlDeviceGetUUID"))?));
    }
    Ok(devices)
}
