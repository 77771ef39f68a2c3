//! Real GPUs through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run
//! time, so the agent builds and runs its tests on machines without a GPU).
//!
//! Health: a thread waits for critical XID events on every GPU and marks
//! the GPU unhealthy with the XID in its message; a GPU whose queries fail
//! is unhealthy too. The list is re-read on every poll, so a GPU that
//! answers again comes back healthy unless an XID marked it.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use nvml_wrapper::Nvml;
use tessera_api::v1alpha1::DeviceHealth;

use super::{Backend, HostUsage, PhysicalGpu};
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
}

impl NvmlBackend {
    /// Loads NVML and starts watching XID events.
    pub fn new() -> Result<Self, Error> {
        let nvml = Nvml::init().map_err(|e| Error::Nvml(format!("loading NVML: {e}")))?;
        let xids = Arc::new(Mutex::new(BTreeMap::new()));
        let watched = xids.clone();
        std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || watch_xids(&watched))
            .map_err(|e| Error::Nvml(format!("starting the XID thread: {e}")))?;
        Ok(Self { nvml, xids })
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
            health: if xid.is_some() {
                DeviceHealth::Unhealthy
            } else {
                DeviceHealth::Healthy
            },
            health_message: xid.map(|x| format!("critical XID {x}")),
            mig: None,
            uuid,
        })
    }
}

impl Backend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
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
fn watch_xids(xids: &Mutex<BTreeMap<String, u64>>) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let Ok(nvml) = Nvml::init() else { return };
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
