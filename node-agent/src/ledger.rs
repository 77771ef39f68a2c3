//! Records in the ledger what the agent served without a Bind: a
//! VgpuAllocation the agent writes itself (the mirror of a prepared DRA
//! claim, or of a pod holding static MIG instances), created or replaced and
//! marked Allocated, so `kubectl get vgpuallocations` shows every holder.
//!
//! Only an allocation the agent wrote is ever replaced. One the scheduler's
//! Bind wrote (the same pod may hold a vendor slice and a static MIG
//! instance on a mixed node) holds slices and a quota charge the agent does
//! not know of: deleting it would free them while the pod runs. It is kept,
//! and the agent's record is not written ([`Recorded::Kept`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams, Preconditions},
};
use tessera_api::v1alpha1::{
    AllocationPhase, ServedMigInstance, VgpuAllocation, VgpuAllocationSpec, VgpuAllocationStatus,
};

use crate::Error;

/// Whether two specs record the same holding; the trace context differs
/// between repeats of one preparation and says nothing of what is held.
fn same_holder(a: &VgpuAllocationSpec, b: &VgpuAllocationSpec) -> bool {
    let untraced = |spec: &VgpuAllocationSpec| VgpuAllocationSpec {
        trace_context: None,
        ..spec.clone()
    };
    untraced(a) == untraced(b)
}

/// Whether `allocation` is one the agent may have written (a DRA mirror or
/// a static MIG holder's record): none of what only the scheduler's Bind
/// writes, which are a GPU or node policy, a pod priority, a quota charge,
/// a preemption nomination, or a slice of another vendor's device.
pub fn agent_written(allocation: &VgpuAllocation) -> bool {
    let spec = &allocation.spec;
    let vendor = spec
        .containers
        .iter()
        .flat_map(|c| &c.devices)
        .any(|slice| !slice.family.is_nvidia());
    spec.gpu_policy.is_none()
        && spec.node_policy.is_none()
        && spec.priority.is_none()
        && spec.quota.is_empty()
        && spec.nomination.is_none()
        && !vendor
}

/// What [`record`] does with `found`, the allocation of its record's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// It is the record (an earlier pass wrote it).
    Same,
    /// An earlier holder's record, written by the agent: replaced.
    Earlier,
    /// The scheduler wrote it: kept, and the record is not written.
    Scheduler,
}

/// What [`record`] does with `found` when it writes `record` of the same name.
pub fn existing(found: &VgpuAllocation, record: &VgpuAllocation) -> Existing {
    if same_holder(&found.spec, &record.spec) {
        Existing::Same
    } else if agent_written(found) {
        Existing::Earlier
    } else {
        Existing::Scheduler
    }
}

/// What [`record`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The record is in the ledger, Allocated.
    Written,
    /// An allocation the scheduler wrote has the name: it was kept and the
    /// record not written.
    Kept,
}

/// Creates `record` (or finds it from an earlier pass with the same spec)
/// and marks it Allocated, saying `why`, with the MIG instances it holds.
/// One of the same name with another spec that the agent wrote is left from
/// an earlier holder (an earlier allocation of the claim, an earlier pod of
/// the name): it is replaced. One the scheduler wrote is never deleted
/// ([`Recorded::Kept`], with a warning).
pub async fn record(
    client: &Client,
    record: VgpuAllocation,
    why: &str,
    mig_instances: Vec<ServedMigInstance>,
) -> Result<Recorded, Error> {
    let namespace = record.metadata.namespace.clone().unwrap_or_default();
    let name = record.metadata.name.clone().unwrap_or_default();
    let api = Api::<VgpuAllocation>::namespaced(client.clone(), &namespace);
    let context = |what: &str| format!("{what} VgpuAllocation {namespace}/{name}");
    let current = loop {
        match api.create(&PostParams::default(), &record).await {
            Ok(created) => break created,
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(Error::kube(context("creating"))(e)),
        }
        let Some(found) = api
            .get_opt(&name)
            .await
            .map_err(Error::kube(context("reading")))?
        else {
            continue;
        };
        match existing(&found, &record) {
            Existing::Same => break found,
            Existing::Scheduler => {
                tracing::warn!(
                    namespace,
                    allocation = name,
                    pod_uid = %found.spec.pod_uid,
                    "an allocation the scheduler wrote has this name: it is kept, and what the agent served is not recorded in the ledger"
                );
                return Ok(Recorded::Kept);
            }
            Existing::Earlier => {}
        }
        tracing::info!(
            namespace,
            allocation = name,
            "replacing the allocation of an earlier holder of the name"
        );
        let params = DeleteParams::default().preconditions(Preconditions {
            uid: found.metadata.uid.clone(),
            resource_version: None,
        });
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(Error::kube(context("replacing"))(e)),
        }
    };
    if current.status.as_ref().and_then(|s| s.phase) == Some(AllocationPhase::Allocated) {
        return Ok(Recorded::Written);
    }
    let status = VgpuAllocationStatus {
        phase: Some(AllocationPhase::Allocated),
        served_containers: current
            .spec
            .containers
            .iter()
            .map(|c| c.name.clone())
            .collect(),
        mig_instances,
        allocated_at: Some(Time(crate::whole_seconds_now())),
        message: Some(why.to_owned()),
        ..VgpuAllocationStatus::default()
    };
    crate::STATUS
        .apply_at(&api, &name, None, &status)
        .await
        .map_err(Error::kube(context("marking Allocated")))?;
    Ok(Recorded::Written)
}

#[cfg(test)]
mod tests;
