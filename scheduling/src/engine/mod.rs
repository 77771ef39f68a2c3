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

mod fit;
mod node;
mod placement;
pub mod preempt;
pub mod quota;
mod reason;
mod score;
mod topology;
pub mod tuning;
mod wings;

#[cfg(test)]
mod controls_tests;
#[cfg(test)]
mod counted_tests;
#[cfg(test)]
mod metax_tests;
#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod quota_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vendor_tests;

pub use fit::{feasible, fit};
pub use node::{DeviceUsage, GpuDevice, NodeGpus, Profile};
pub use placement::{
    ContainerPlacement, EXCLUSIVE_CORES, MAX_CORE_INDEXES, MigCut, Placement, Slice, core_indexes,
    core_mask,
};
pub use reason::{Lack, Rejection};
pub use score::{device_score, node_score, prioritized_score};
pub use topology::{normalize as normalize_topology, topology_score};
