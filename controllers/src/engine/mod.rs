//! The allocation engine: does a pod's GPU request fit a node, which devices
//! does each container get, and how good is the node.
//!
//! Pure logic: no Kubernetes, HTTP or async types in its API. The projection
//! feeds it node views; the extender turns its answers into HTTP replies.
//!
//! Rules (HAMi's, made exact):
//! - A vGPU takes one slice of a device: `memory` MiB (a percentage resolves
//!   against the device's capacity after scaling) and `cores` percent of SMs.
//! - A device holds at most `split_count` slices, `memory_mib` MiB and `cores`
//!   cores in total (invariant I1).
//! - A slice of 100 cores is exclusive: the device must be empty and stays
//!   closed to everyone else while the slice lives.
//! - A container's vGPUs are on distinct devices; with `numa-bind` they share
//!   one NUMA node. Containers of one pod are placed in order, each seeing the
//!   slices of the ones before.
//! - Unhealthy devices, and devices excluded by type, UUID or mode, are skipped.
//! - On a dynamic-MIG device a slice is a MIG instance: the smallest profile
//!   whose memory and compute cover the request, at a free placement
//!   (`tessera_api::mig::choose`); it holds the profile's memory and its
//!   compute share, and no two instances share a memory slice (I1).

use tessera_api::v1alpha1::{MigPlacement, Sharing};

mod fit;
mod node;
mod reason;
mod score;
mod topology;
mod wings;

#[cfg(test)]
mod metax_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vendor_tests;

pub use fit::{feasible, fit};
pub use node::{DeviceUsage, GpuDevice, NodeGpus, Profile};
pub use reason::Rejection;
pub use score::{device_load, node_score, prioritized_score};
pub use topology::{normalize as normalize_topology, topology_score};

/// Cores that make a slice exclusive.
pub const EXCLUSIVE_CORES: u32 = 100;

/// A slice of one device given to a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slice {
    /// Position of the device in [`NodeGpus::devices`].
    pub device: usize,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// Percent of SMs (vendors: the device's own unit, see
    /// [`GpuDevice::cores`]).
    pub cores: u32,
    /// The MIG instance serving the slice, on a dynamic-MIG device.
    pub mig: Option<MigCut>,
    /// The device cores it holds by index, as a mask (AWS NeuronCores,
    /// which the plugin hands out by index); 0 elsewhere.
    pub core_mask: u8,
    /// How many of the device's slices it takes (`split_count` counts
    /// them): an Enflame DRS partition's size; 1 elsewhere.
    pub units: u32,
    /// The device's profile it is cut as (Enflame DRS), by position.
    pub profile: Option<u8>,
    /// How it shares its device (MetaX sGPUs: app class and QoS policy).
    pub sharing: Option<Sharing>,
}

/// Cores a device may hand out by index (bits of [`Slice::core_mask`]).
pub const MAX_CORE_INDEXES: usize = 8;

/// The core indexes a mask names, ascending.
pub fn core_indexes(mask: u8) -> Vec<u32> {
    (0..MAX_CORE_INDEXES as u32)
        .filter(|bit| mask & (1 << bit) != 0)
        .collect()
}

/// The mask of core indexes (those past [`MAX_CORE_INDEXES`] ignored: no
/// device hands out more).
pub fn core_mask(indexes: &[u32]) -> u8 {
    indexes
        .iter()
        .filter(|&&i| (i as usize) < MAX_CORE_INDEXES)
        .fold(0, |mask, &i| mask | (1 << i))
}

/// A MIG instance to create: which profile of the device's layout, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MigCut {
    /// Position of the profile in the device's [`MigLayout::profiles`]
    /// (`None` for a slice read back from an allocation: only its
    /// placement counts there).
    ///
    /// [`MigLayout::profiles`]: tessera_api::v1alpha1::MigLayout::profiles
    pub profile: Option<usize>,
    /// Where on the device.
    pub placement: MigPlacement,
}

/// The slices one container gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPlacement {
    /// The container's name.
    pub name: String,
    /// One slice per requested vGPU, on distinct devices.
    pub slices: Vec<Slice>,
}

/// Where every GPU container of a pod goes on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Containers in request order.
    pub containers: Vec<ContainerPlacement>,
}

impl Placement {
    /// Every slice of every container.
    pub fn slices(&self) -> impl Iterator<Item = &Slice> {
        self.containers.iter().flat_map(|c| &c.slices)
    }
}
