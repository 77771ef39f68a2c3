//! From custom resources to the engine's and the ledger's types.

use std::sync::Arc;

use kube::ResourceExt;
use tessera_api::{
    mig,
    v1alpha1::{DeviceHealth, FrontDoor, GpuNode, VgpuAllocation},
};

use super::ledger::{AllocationKey, DRA_DOOR, LiveAllocation, UuidSlice};
use crate::engine::{GpuDevice, Profile};

/// The schedulable devices of a GpuNode.
pub fn devices(node: &GpuNode) -> Vec<GpuDevice> {
    let Some(status) = &node.status else {
        return Vec::new();
    };
    status
        .devices
        .iter()
        .map(|d| GpuDevice {
            uuid: d.uuid.clone(),
            index: d.index,
            model: d.model.clone(),
            family: d.family,
            network_id: d.network_id,
            memory_mib: d.capacity.memory_mib,
            cores: d.capacity.cores,
            split_count: d.split_count,
            numa_node: d.numa_node,
            healthy: d.health == DeviceHealth::Healthy,
            cordoned: d.cordoned_by.is_some(),
            mode: d.mode,
            mig: d
                .mig
                .as_ref()
                .filter(|layout| mig::usable(layout))
                .map(|layout| Arc::new(layout.clone())),
            mig_present: mig::occupied(d.mig_instances.iter().map(|i| i.placement)),
            profiles: profiles(&d.profiles),
            minor: d.minor.clone(),
            qos_policy: d.qos_policy,
        })
        .collect()
}

/// What the vendor's plugin says about taking whole devices of the node.
pub fn placement_scores(node: &GpuNode) -> Vec<tessera_api::v1alpha1::PlacementScore> {
    node.status
        .as_ref()
        .map(|s| s.placement_scores.clone())
        .unwrap_or_default()
}

/// How many of its device's slices a slice takes: an Enflame DRS
/// partition's size (its profile, recorded as the slice's template); 1
/// for every other slice.
fn slice_units(slice: &tessera_api::v1alpha1::DeviceSlice) -> u32 {
    slice
        .template
        .as_deref()
        .filter(|_| slice.family == tessera_api::v1alpha1::DeviceFamily::Enflame)
        .and_then(tessera_scheduling::request::drs_profile)
        .map_or(1, |(size, _)| size)
}

/// A device's partition profiles (Enflame DRS) as the engine counts them,
/// smallest first (HAMi's `collectDRSProfiles`): names it cannot read are
/// skipped, a profile's cores are its share of the largest one's slices.
fn profiles(listed: &[tessera_api::v1alpha1::DeviceProfile]) -> Vec<Profile> {
    let parsed: Vec<(&tessera_api::v1alpha1::DeviceProfile, u32, u32)> = listed
        .iter()
        .filter_map(|p| tessera_scheduling::request::drs_profile(&p.name).map(|(s, gb)| (p, s, gb)))
        .collect();
    let Some(largest) = parsed.iter().map(|(_, size, _)| *size).max() else {
        return Vec::new();
    };
    let mut profiles: Vec<Profile> = parsed
        .into_iter()
        .map(|(listed, size, gb)| Profile {
            name: listed.name.clone(),
            id: listed.id.clone(),
            size,
            memory_mib: u64::from(gb) * 1024,
            cores: (size * 100).div_ceil(largest),
        })
        .collect();
    profiles.sort_by(|a, b| (a.size, a.memory_mib, &a.name).cmp(&(b.size, b.memory_mib, &b.name)));
    profiles.dedup_by(|a, b| a.name == b.name);
    profiles
}

/// Why the node takes no pod now: its `Ready` condition is False (the agent
/// says the kubelet would reject GPU pods at admission) or Unknown (the
/// lifecycle controller found the agent's Lease lapsed), or the node serves
/// its GPUs through the DRA front door (no HAMi-style pod can have them).
/// `None` when True, or when the GpuNode has no condition (older agents).
pub fn not_ready(node: &GpuNode) -> Option<String> {
    let class = tessera_api::names::dra::DEVICE_CLASS;
    if let Some(status) = &node.status {
        if status.front_door == FrontDoor::Dra {
            return Some(format!(
                "{DRA_DOOR}: the node serves its GPUs through DRA (frontDoor: dra); ask for them with a ResourceClaim of DeviceClass {class}"
            ));
        }
        // Asked to switch: the device plugin takes nothing new meanwhile,
        // or the switch might wait forever.
        if status.settings.front_door == FrontDoor::Dra {
            return Some(format!(
                "{DRA_DOOR}: the node is switching to DRA (frontDoor: dra) and takes no new pod through the device plugin; ask for its GPUs with a ResourceClaim of DeviceClass {class}"
            ));
        }
    }
    let condition = node
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (condition.status != "True").then(|| format!("{}: {}", condition.reason, condition.message))
}

/// Since when the GpuNode's `Ready` condition says True, if it does.
pub fn ready_since(node: &GpuNode) -> Option<k8s_openapi::jiff::Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.0)
}

/// The ledger key of an allocation.
pub fn key(allocation: &VgpuAllocation) -> AllocationKey {
    AllocationKey {
        namespace: allocation.namespace().unwrap_or_default(),
        name: allocation.name_any(),
    }
}

/// The allocation's slices while it holds them; `None` once Released or Failed.
///
/// A DRA mirror (`spec.claim` set) is written by a node agent, never by
/// Bind, and legitimately carries no quota charge and no priority (DRA
/// claims are not counted against device quotas, and a mirror is never a
/// preemption victim): whatever such an object says of them is ignored, so
/// a forged mirror cannot fill a namespace's quota nor be chosen as a
/// low-priority victim (review finding H4).
pub fn live(allocation: &VgpuAllocation) -> Option<LiveAllocation> {
    if !allocation.is_live() {
        return None;
    }
    let spec = &allocation.spec;
    let mirror = spec.claim.is_some();
    Some(LiveAllocation {
        pod_uid: spec.pod_uid.clone(),
        node: spec.node_name.clone(),
        slices: spec
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .map(|d| UuidSlice {
                uuid: d.uuid.clone(),
                memory_mib: d.memory_mib,
                cores: d.cores,
                mig: d.mig.as_ref().map(|m| m.placement),
                core_indexes: d.core_indexes.clone(),
                units: slice_units(d),
                sharing: d.sharing,
                mutex: d.mutex,
            })
            .collect(),
        quota: if mirror {
            Default::default()
        } else {
            spec.quota.clone()
        },
        priority: spec.priority.filter(|_| !mirror),
        nominated: spec.nomination.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use tessera_api::{
        testing::{allocation, container, slice},
        v1alpha1::{AllocationPhase, FrontDoor, GpuNode, GpuNodeStatus},
    };

    use super::{live, not_ready};

    #[test]
    fn a_dra_mirror_holds_its_slices_in_the_ledger_like_a_pod() {
        let mirror = allocation("infer", "pod-uid", "n1")
            .claim("infer-gpu", "claim-uid")
            .container(container("gpu", vec![slice("GPU-0", 0, 8192, 30)]))
            .phase(AllocationPhase::Allocated)
            .build();
        let held = live(&mirror).expect("a prepared claim holds its slices");
        assert_eq!(held.node, "n1");
        assert_eq!(
            (
                held.slices[0].uuid.as_str(),
                held.slices[0].memory_mib,
                held.slices[0].cores
            ),
            ("GPU-0", 8192, 30)
        );
        let mut released = mirror;
        released.status.as_mut().unwrap().phase = Some(AllocationPhase::Released);
        assert!(
            live(&released).is_none(),
            "an unprepared claim holds nothing"
        );
    }

    /// Review finding H4: a mirror's quota and priority (which only a
    /// forger would write) count for nothing; a Bind-written allocation's
    /// count as written.
    #[test]
    fn a_mirror_s_quota_and_priority_are_ignored() {
        let forge = |claim: bool| {
            let mut builder = allocation("coredns-x", "pod-uid", "n1")
                .container(container("gpu", vec![slice("GPU-0", 0, 8192, 30)]))
                .phase(AllocationPhase::Allocated);
            if claim {
                builder = builder.claim("x", "claim-uid");
            }
            let mut forged = builder.build();
            forged.spec.priority = Some(-2_147_483_647);
            forged.spec.quota = [("nvidia.com/gpumem".to_owned(), 1_000_000_000)].into();
            forged
        };
        let mirror = live(&forge(true)).unwrap();
        assert!(mirror.quota.is_empty(), "{:?}", mirror.quota);
        assert_eq!(mirror.priority, None);
        assert_eq!(mirror.slices.len(), 1, "its slices still hold the device");
        let bound = live(&forge(false)).unwrap();
        assert_eq!(bound.quota["nvidia.com/gpumem"], 1_000_000_000);
        assert_eq!(bound.priority, Some(-2_147_483_647));
    }

    #[test]
    fn a_node_behind_the_dra_door_takes_no_hami_pod() {
        let mut node = GpuNode::new("n1", Default::default());
        node.status = Some(GpuNodeStatus::default());
        assert_eq!(not_ready(&node), None);
        // Asked to switch: no new pod while the node drains.
        node.status.as_mut().unwrap().settings.front_door = FrontDoor::Dra;
        let reason = not_ready(&node).unwrap();
        assert!(reason.contains("is switching to DRA"), "{reason}");
        node.status.as_mut().unwrap().front_door = FrontDoor::Dra;
        let reason = not_ready(&node).unwrap();
        assert!(
            reason.contains("frontDoor: dra") && reason.contains("vgpu.tessera.dev"),
            "{reason}"
        );
    }
}
