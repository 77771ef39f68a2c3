//! What a backend reports: the node's physical GPUs and MIG instances, and
//! the [`Backend`] interface NVML and the fake file implement.

use serde::{Deserialize, Serialize};
use tessera_api::v1alpha1::{DeviceHealth, MigInstance, MigLayout, MigPlacement, MigProfile};

use crate::Error;

/// One physical GPU as the backend reports it, before the node's settings
/// (split count, scaling, filters) are applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PhysicalGpu {
    /// The GPU's UUID, `GPU-…`.
    pub uuid: String,
    /// The GPU's index on the node.
    pub index: u32,
    /// The model name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub model: String,
    /// Device memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// The NUMA node the GPU is attached to, if known.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// UUIDs of GPUs linked to this one by NVLink.
    #[serde(default)]
    pub nvlink_peers: Vec<String>,
    /// The CUDA compute capability, `major.minor` (`9.0` on an H100).
    #[serde(default)]
    pub compute_capability: Option<String>,
    /// The NVIDIA driver's version (`550.54.15`).
    #[serde(default)]
    pub driver_version: Option<String>,
    /// Whether the GPU can take work.
    #[serde(default = "healthy")]
    pub health: DeviceHealth,
    /// Why the GPU is unhealthy (e.g. the XID event seen).
    #[serde(default)]
    pub health_message: Option<String>,
    /// The GPU's MIG state, when it can do MIG (the fake backend's file
    /// sets it in its own `mig` section, never per device).
    #[serde(skip)]
    pub mig: Option<PhysicalMig>,
}

/// What a MIG-capable GPU can be cut into and what is cut now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhysicalMig {
    /// Whether MIG mode is on (the current mode, not a pending one).
    pub enabled: bool,
    /// The GPU's profiles and placements.
    pub layout: MigLayout,
    /// The instances that exist, each with a compute instance (`held_by`
    /// is never set here: the backend knows no allocations).
    pub instances: Vec<MigInstance>,
}

fn healthy() -> DeviceHealth {
    DeviceHealth::Healthy
}

/// What a backend measured on one physical GPU just now (the host view:
/// every process on the GPU, inside Tessera's containers or not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostUsage {
    /// The GPU's UUID.
    pub uuid: String,
    /// The GPU's index on the node.
    pub index: u32,
    /// The model name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub model: String,
    /// Device memory in use, bytes; `None` when the GPU does not report it
    /// (NVML answers "not supported" on unified-memory GPUs).
    pub memory_used_bytes: Option<u64>,
    /// Percent of the last sample period in which a kernel ran (NVML's
    /// `utilization.gpu`), 0-100; `None` when the GPU does not report it.
    pub utilization_percent: Option<u32>,
}

/// A source of the node's GPUs.
pub trait Backend: Send + Sync + 'static {
    /// A short name for logs (`nvml`, `fake`).
    fn name(&self) -> &'static str;
    /// The GPUs as they are now, health included.
    fn devices(&self) -> Result<Vec<PhysicalGpu>, Error>;
    /// Memory in use and utilisation per GPU, measured now; empty for a
    /// backend that measures nothing (fake GPUs have no usage to report).
    fn usage(&self) -> Result<Vec<HostUsage>, Error> {
        Ok(Vec::new())
    }
    /// The MIG instances on GPU `gpu` now, read afresh.
    fn mig_instances(&self, gpu: &str) -> Result<Vec<MigInstance>, Error> {
        Err(no_mig(self.name(), gpu))
    }
    /// Creates a GPU instance of `profile` at `placement` on GPU `gpu`, with
    /// one compute instance spanning it; returns the MIG device's UUID.
    fn create_mig(
        &self,
        gpu: &str,
        profile: &MigProfile,
        placement: MigPlacement,
    ) -> Result<MigInstance, Error> {
        let _ = (profile, placement);
        Err(no_mig(self.name(), gpu))
    }
    /// Destroys the MIG instance `uuid` on GPU `gpu` (compute instance, then
    /// GPU instance). Fails while a process uses it.
    fn destroy_mig(&self, gpu: &str, uuid: &str) -> Result<(), Error> {
        let _ = uuid;
        Err(no_mig(self.name(), gpu))
    }
}

fn no_mig(backend: &str, gpu: &str) -> Error {
    Error::Mig(format!(
        "GPU {gpu}: the {backend} backend cannot manage MIG instances"
    ))
}
