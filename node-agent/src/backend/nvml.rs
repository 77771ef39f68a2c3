//! Real GPUs through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run
//! time, so the agent builds and runs its tests on machines without a GPU).
//!
//! Health: a thread waits for critical XID events on every GPU and marks
//! the GPU unhealthy with the XID in its message; a GPU whose queries fail
//! is unhealthy too. The list is re-read on every poll, so a GPU that
//! answers again comes back healthy unless an XID marked it.
//!
//! MIG: a MIG-capable GPU reports its mode, its profiles and placements (read
//! once per GPU) and its instances (read on every poll), and instances are
//! created and destroyed through `tessera-nvml-mig`, which makes the NVML
//! calls nvml-wrapper has no safe method for.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::OsString,
    sync::{Arc, Mutex},
};

use nvml_wrapper::{Device, Nvml, error::NvmlError};
use tessera_api::v1alpha1::{DeviceHealth, MigInstance, MigLayout, MigPlacement, MigProfile};
use tessera_nvml_mig as nvml_mig;

use super::gpu::{Backend, HostUsage, PhysicalGpu, PhysicalMig};
use crate::Error;

/// XIDs that do not mean the GPU is broken (application errors), as the
/// NVIDIA device plugin skips them.
const APPLICATION_XIDS: [u64; 4] = [13, 31, 43, 45];

/// NVML's `NVML_NVLINK_MAX_LINKS`.
const MAX_NVLINKS: u32 = 18;

/// GPUs from NVML.
pub struct NvmlBackend {
    nvml: Nvml,
    xids: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Each MIG-capable GPU's profiles, by GPU UUID (they never change).
    profiles: Mutex<HashMap<String, Vec<nvml_mig::Profile>>>,
}

/// Loads `library`, or `libnvidia-ml.so` from the loader's path.
fn load(library: Option<&OsString>) -> Result<Nvml, NvmlError> {
    match library {
        Some(path) => Nvml::builder().lib_path(path).init(),
        None => Nvml::init(),
    }
}

impl NvmlBackend {
    /// Loads NVML and starts watching XID events.
    pub fn new() -> Result<Self, Error> {
        Self::with_library(None)
    }

    /// [`NvmlBackend::new`] with NVML loaded from `library` (a path)
    /// instead of the loader's search path.
    pub fn with_library(library: Option<OsString>) -> Result<Self, Error> {
        let nvml = load(library.as_ref()).map_err(|e| Error::Nvml(format!("loading NVML: {e}")))?;
        let xids = Arc::new(Mutex::new(BTreeMap::new()));
        let watched = xids.clone();
        std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || watch_xids(library.as_ref(), &watched))
            .map_err(|e| Error::Nvml(format!("starting the XID thread: {e}")))?;
        Ok(Self {
            nvml,
            xids,
            profiles: Mutex::default(),
        })
    }

    /// GPU `uuid`'s device handle.
    fn by_uuid(&self, uuid: &str) -> Result<Device<'_>, Error> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|e| Error::Mig(format!("GPU {uuid}: {e}")))
    }

    /// The GPU's profiles, read once.
    fn profiles(&self, device: &Device<'_>, uuid: &str) -> Result<Vec<nvml_mig::Profile>, Error> {
        let mut cache = self.profiles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(profiles) = cache.get(uuid) {
            return Ok(profiles.clone());
        }
        let profiles = nvml_mig::profiles(device).map_err(|e| mig_error(uuid, e))?;
        cache.insert(uuid.to_owned(), profiles.clone());
        Ok(profiles)
    }

    /// The GPU's MIG state; `None` for a GPU without MIG.
    fn mig(&self, device: &Device<'_>, uuid: &str) -> Option<PhysicalMig> {
        let (enabled, _) = match nvml_mig::mig_mode(device) {
            Ok(mode) => mode,
            Err(nvml_mig::Error::Nvml {
                source: NvmlError::NotSupported,
                ..
            }) => return None,
            Err(error) => {
                tracing::warn!(gpu = %uuid, %error, "reading the MIG mode failed");
                return None;
            }
        };
        let read = || -> Result<PhysicalMig, Error> {
            let profiles = self.profiles(device, uuid)?;
            let instances = if enabled {
                let found =
                    nvml_mig::instances(device, &profiles).map_err(|e| mig_error(uuid, e))?;
                found
                    .into_iter()
                    .filter_map(|i| instance(&profiles, i))
                    .collect()
            } else {
                Vec::new()
            };
            Ok(PhysicalMig {
                enabled,
                layout: layout(&profiles),
                instances,
            })
        };
        read()
            .inspect_err(|error| tracing::warn!(gpu = %uuid, %error, "reading MIG state failed"))
            .ok()
    }

    fn device(&self, index: u32) -> Result<PhysicalGpu, nvml_wrapper::error::NvmlError> {
        let device = self.nvml.device_by_index(index)?;
        let uuid = device.uuid()?;
        let pci = device.pci_info()?;
        let mut nvlink_peers = Vec::new();
        for link in 0..MAX_NVLINKS {
            let link = device.link_wrapper_for(link);
            if link.is_active().unwrap_or(false)
                && let Ok(remote) = link.remote_pci_info()
                && let Ok(peer) = self.nvml.device_by_pci_bus_id(remote.bus_id.as_str())
                && let Ok(peer) = peer.uuid()
                && !nvlink_peers.contains(&peer)
            {
                nvlink_peers.push(peer);
            }
        }
        let xid = self
            .xids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&uuid)
            .copied();
        Ok(PhysicalGpu {
            index,
            model: device.name()?,
            memory_mib: device.memory_info()?.total / (1 << 20),
            numa_node: numa_node(&pci.bus_id),
            nvlink_peers,
            compute_capability: device
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            driver_version: self.nvml.sys_driver_version().ok(),
            health: if xid.is_some() {
                DeviceHealth::Unhealthy
            } else {
                DeviceHealth::Healthy
            },
            health_message: xid.map(|x| format!("critical XID {x}")),
            mig: self.mig(&device, &uuid),
            uuid,
        })
    }
}

impl Backend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn mig_instances(&self, gpu: &str) -> Result<Vec<MigInstance>, Error> {
        let device = self.by_uuid(gpu)?;
        let profiles = self.profiles(&device, gpu)?;
        let found = nvml_mig::instances(&device, &profiles).map_err(|e| mig_error(gpu, e))?;
        Ok(found
            .into_iter()
            .filter_map(|i| instance(&profiles, i))
            .collect())
    }

    fn create_mig(
        &self,
        gpu: &str,
        profile: &MigProfile,
        placement: MigPlacement,
    ) -> Result<MigInstance, Error> {
        let device = self.by_uuid(gpu)?;
        let profiles = self.profiles(&device, gpu)?;
        let known = profiles
            .iter()
            .find(|p| p.id == profile.id && p.name == profile.name)
            .ok_or_else(|| {
                Error::Mig(format!(
                    "GPU {gpu}: no profile {} (id {})",
                    profile.name, profile.id
                ))
            })?;
        if placement.size != known.memory_slices {
            return Err(Error::Mig(format!(
                "GPU {gpu}: {} occupies {} memory slices, not {}",
                known.name, known.memory_slices, placement.size
            )));
        }
        let made =
            nvml_mig::create(&device, known, placement.start).map_err(|e| mig_error(gpu, e))?;
        instance(&profiles, made).ok_or_else(|| {
            Error::Mig(format!(
                "GPU {gpu}: the new {} instance has no MIG device",
                known.name
            ))
        })
    }

    fn destroy_mig(&self, gpu: &str, uuid: &str) -> Result<(), Error> {
        let device = self.by_uuid(gpu)?;
        let profiles = self.profiles(&device, gpu)?;
        nvml_mig::destroy(&device, &profiles, uuid).map_err(|e| mig_error(gpu, e))
    }

    fn devices(&self) -> Result<Vec<PhysicalGpu>, Error> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| Error::Nvml(format!("counting GPUs: {e}")))?;
        let mut devices = Vec::new();
        for index in 0..count {
            match self.device(index) {
                Ok(device) => devices.push(device),
                Err(error) => {
                    tracing::warn!(index, %error, "GPU does not answer NVML; reporting it unhealthy");
                    let uuid = self
                        .nvml
                        .device_by_index(index)
                        .and_then(|d| d.uuid())
                        .unwrap_or_else(|_| format!("GPU-unknown-{index}"));
                    devices.push(PhysicalGpu {
                        uuid,
                        index,
                        model: String::new(),
                        memory_mib: 0,
                        numa_node: None,
                        nvlink_peers: Vec::new(),
                        compute_capability: None,
                        driver_version: None,
                        health: DeviceHealth::Unhealthy,
                        health_message: Some(format!("NVML: {error}")),
                        mig: None,
                    });
                }
            }
        }
        Ok(devices)
    }

    fn usage(&self) -> Result<Vec<HostUsage>, Error> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| Error::Nvml(format!("counting GPUs: {e}")))?;
        let mut usage = Vec::new();
        for index in 0..count {
            // A GPU that does not answer is reported by `devices` as
            // unhealthy; here it is only left out.
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            let (Ok(uuid), Ok(model)) = (device.uuid(), device.name()) else {
                continue;
            };
            usage.push(HostUsage {
                uuid,
                index,
                model,
                memory_used_bytes: device.memory_info().ok().map(|m| m.used),
                utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
            });
        }
        Ok(usage)
    }
}

fn mig_error(gpu: &str, error: nvml_mig::Error) -> Error {
    Error::Mig(format!("GPU {gpu}: {error}"))
}

/// The layout the scheduler places on: NVML's profiles as Tessera's.
fn layout(profiles: &[nvml_mig::Profile]) -> MigLayout {
    MigLayout {
        memory_slices: profiles
            .iter()
            .flat_map(|p| p.placements.iter().map(move |s| s + p.memory_slices))
            .max()
            .unwrap_or(0),
        compute_slices: profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0),
        profiles: profiles
            .iter()
            .map(|p| MigProfile {
                name: p.name.clone(),
                id: p.id,
                memory_mib: p.memory_mib,
                compute_slices: p.compute_slices,
                memory_slices: p.memory_slices,
                max_instances: p.max_instances,
                placements: p.placements.clone(),
                media: p.name.contains("+me"),
            })
            .collect(),
    }
}

/// An instance as Tessera lists it; `None` for a GPU instance without a
/// MIG device (no compute instance yet: nothing to hand out).
fn instance(profiles: &[nvml_mig::Profile], found: nvml_mig::Instance) -> Option<MigInstance> {
    let profile = profiles.iter().find(|p| p.id == found.profile_id)?;
    Some(MigInstance {
        profile: profile.name.clone(),
        uuid: found.uuid?,
        memory_mib: profile.memory_mib,
        placement: MigPlacement {
            start: found.start,
            size: found.size,
        },
        held_by: None,
    })
}

/// The NUMA node of a PCI device, from sysfs (`-1` means none).
fn numa_node(bus_id: &str) -> Option<u32> {
    // NVML reports an 8-digit domain (00000000:3B:00.0); sysfs uses 4.
    let id = bus_id.to_lowercase();
    let id = id.strip_prefix("0000").unwrap_or(&id);
    std::fs::read_to_string(format!("/sys/bus/pci/devices/{id}/numa_node"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Waits for critical XID events on every GPU; runs for the process's life.
fn watch_xids(library: Option<&OsString>, xids: &Mutex<BTreeMap<String, u64>>) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let Ok(nvml) = load(library) else { return };
    let Ok(mut set) = nvml.create_event_set() else {
        return;
    };
    for index in 0..nvml.device_count().unwrap_or(0) {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(registered) => set = registered,
            Err(error) => {
                tracing::warn!(index, %error, "XID events unavailable for this GPU");
                let Ok(fresh) = nvml.create_event_set() else {
                    return;
                };
                set = fresh;
            }
        }
    }
    loop {
        match set.wait(5_000) {
            Ok(event) => {
                use nvml_wrapper::enums::event::XidError;
                let xid = match event.event_data {
                    Some(XidError::Value(xid)) => xid,
                    Some(XidError::Unknown) | None => 0,
                };
                if APPLICATION_XIDS.contains(&xid) {
                    continue;
                }
                if let Ok(uuid) = event.device.uuid() {
                    tracing::error!(gpu = %uuid, xid, "critical XID: marking the GPU unhealthy");
                    xids.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(uuid, xid);
                }
            }
            Err(nvml_wrapper::error::NvmlError::Timeout) => {}
            Err(error) => {
                tracing::warn!(%error, "waiting for XID events failed; health now comes from queries only");
                return;
            }
        }
    }
}
