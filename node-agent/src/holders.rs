//! Who holds what on the node, read from its allocations alone: the live
//! allocations, and the holder of each MIG instance.

use std::collections::HashMap;

use kube::ResourceExt;
use tessera_api::v1alpha1::{MigPlacement, VgpuAllocation};

/// How many slices of live allocations each GPU (by UUID) holds.
pub fn users_per_gpu(allocations: &[VgpuAllocation]) -> std::collections::BTreeMap<&str, usize> {
    let mut users = std::collections::BTreeMap::<&str, usize>::new();
    for allocation in live_allocations(allocations) {
        for container in &allocation.spec.containers {
            for slice in &container.devices {
                *users.entry(slice.uuid.as_str()).or_default() += 1;
            }
        }
    }
    users
}

/// The allocations that still hold their slices (not Released or Failed).
pub fn live_allocations(allocations: &[VgpuAllocation]) -> impl Iterator<Item = &VgpuAllocation> {
    allocations.iter().filter(|a| a.is_live())
}

/// The allocation (`namespace/name`) each MIG instance of a live allocation
/// belongs to, by parent GPU and placement.
pub type MigHolders = HashMap<(String, MigPlacement), String>;

/// What live allocations want: per (GPU, placement), the holder and the profile.
pub fn wanted(allocations: &[VgpuAllocation]) -> HashMap<(String, MigPlacement), (String, String)> {
    let mut wanted = HashMap::new();
    for allocation in live_allocations(allocations) {
        let holder = format!(
            "{}/{}",
            allocation.namespace().unwrap_or_default(),
            allocation.name_any()
        );
        for device in allocation.spec.containers.iter().flat_map(|c| &c.devices) {
            if let Some(slice) = &device.mig {
                wanted.insert(
                    (device.uuid.clone(), slice.placement),
                    (holder.clone(), slice.profile.clone()),
                );
            }
        }
    }
    wanted
}

/// The holders of live allocations' MIG instances, for the GpuNode.
pub fn holders(allocations: &[VgpuAllocation]) -> MigHolders {
    wanted(allocations)
        .into_iter()
        .map(|(key, (holder, _))| (key, holder))
        .collect()
}
