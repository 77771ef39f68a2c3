//! What a placement writes: the VgpuAllocation's spec, and the ledger's
//! entry for it. Bind and preemption's hold write the same.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tessera_api::v1alpha1::{
    AllocationTotals, ContainerAllocation, DeviceSlice, MigSlice, TraceContext, VgpuAllocationSpec,
};

use crate::{
    config::Config,
    engine::{GpuDevice, Placement, quota},
    projection::{LiveAllocation, UuidSlice},
};

/// What placing a pod on a node decided: the placement, the node's devices
/// it refers to, and what it counts against its namespace's quotas.
pub(super) type Placed = (Placement, Vec<GpuDevice>, quota::Charge);

/// Places the pod `uid` (of `priority`) on `node` (named `node_name`;
/// `None`: no GpuNode) under its namespace's quota `limits`, the namespace
/// holding `used`: the decision Bind and a preemption's hold both make
/// under the ledger's write lock, with the ledger's entry for it.
#[allow(clippy::too_many_arguments)]
pub(super) fn place(
    node: Option<&crate::engine::NodeGpus>,
    node_name: &str,
    request: &tessera_scheduling::request::PodRequest,
    policy: tessera_api::v1alpha1::SchedulingPolicy,
    (names, limits, used): (
        &[tessera_scheduling::request::QuotaNames<'_>],
        &quota::Limits,
        &quota::Charge,
    ),
    uid: &str,
    priority: Option<i32>,
) -> Result<(Placed, LiveAllocation), crate::Error> {
    let no_room = |reason: String| crate::Error::NoLongerFits {
        node: node_name.to_owned(),
        reason,
    };
    let node = node.ok_or_else(|| no_room(super::filter::NO_GPU_NODE.into()))?;
    let placement =
        crate::engine::fit(node, request, policy).map_err(|r| no_room(r.to_string()))?;
    let charged = quota::charge(request, &placement, names);
    quota::check(limits, used, &charged).map_err(|over| crate::Error::OverQuota {
        reason: over.to_string(),
    })?;
    let devices = node.devices.clone();
    let entry = live(&devices, &placement, uid, node_name, &charged, priority);
    Ok(((placement, devices, charged), entry))
}

/// The owner reference that ties an allocation to its pod: the garbage
/// collector deletes it with the pod.
pub(super) fn owned_by_pod(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

pub(super) fn live(
    devices: &[GpuDevice],
    placement: &Placement,
    uid: &str,
    node: &str,
    charged: &quota::Charge,
    priority: Option<i32>,
) -> LiveAllocation {
    LiveAllocation {
        quota: charged.clone(),
        priority,
        nominated: false,
        pod_uid: uid.to_owned(),
        node: node.to_owned(),
        slices: placement
            .slices()
            .map(|s| UuidSlice {
                uuid: devices[s.device].uuid.clone(),
                memory_mib: s.memory_mib,
                cores: s.cores,
                mig: s.mig.map(|cut| cut.placement),
                core_indexes: crate::engine::core_indexes(s.core_mask),
                units: s.units,
                sharing: s.sharing,
                mutex: s.mutex,
            })
            .collect(),
    }
}

/// The MIG instance a slice on a dynamic-MIG device is served by.
fn mig_slice(device: &GpuDevice, slice: &crate::engine::Slice) -> Option<MigSlice> {
    let cut = slice.mig?;
    let profile = device.mig.as_ref()?.profiles.get(cut.profile?)?;
    Some(MigSlice {
        profile: profile.name.clone(),
        placement: cut.placement,
    })
}

/// The allocation a placement writes, held by nobody else yet.
#[allow(clippy::too_many_arguments)]
pub(super) fn allocation_spec(
    (pod_name, uid, node): (&str, &str, &str),
    devices: &[GpuDevice],
    placement: &Placement,
    request: &tessera_scheduling::request::PodRequest,
    gpu_policy: tessera_api::v1alpha1::SchedulingPolicy,
    config: &Config,
    trace: Option<TraceContext>,
    charged: quota::Charge,
    priority: Option<i32>,
) -> VgpuAllocationSpec {
    // Placements come in request order; a container asking for several
    // families has one request (and placement) per family, merged here into
    // one entry whose slices name their family.
    let mut containers: Vec<ContainerAllocation> = Vec::new();
    for (c, wanted) in placement.containers.iter().zip(&request.containers) {
        let template = wanted.vendor.as_ref().and_then(|v| v.template.clone());
        let slices = c.slices.iter().map(|s| {
            let d = &devices[s.device];
            DeviceSlice {
                uuid: d.uuid.clone(),
                index: d.index,
                family: d.family,
                model: d.model.clone(),
                // Enflame DRS: the profile the engine chose for the device.
                template: s
                    .profile
                    .and_then(|i| d.profiles.get(usize::from(i)))
                    .map(|p| p.name.clone())
                    .or_else(|| template.clone()),
                memory_mib: s.memory_mib,
                cores: s.cores,
                mig: mig_slice(d, s),
                core_indexes: crate::engine::core_indexes(s.core_mask),
                sharing: s.sharing,
                mutex: s.mutex,
            }
        });
        match containers.iter_mut().find(|a| a.name == c.name) {
            Some(merged) => merged.devices.extend(slices),
            None => containers.push(ContainerAllocation {
                priority: wanted.priority,
                name: c.name.clone(),
                devices: slices.collect(),
            }),
        }
    }
    VgpuAllocationSpec {
        quota: charged,
        pod_name: pod_name.to_owned(),
        pod_uid: uid.to_owned(),
        node_name: node.to_owned(),
        totals: AllocationTotals::of(&containers),
        containers,
        gpu_policy: Some(gpu_policy),
        node_policy: Some(
            request
                .options
                .node_policy
                .unwrap_or(config.node_scheduler_policy),
        ),
        claim: None,
        trace_context: trace,
        priority,
        nomination: None,
    }
}
