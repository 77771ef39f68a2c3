//! Records in the ledger what the agent served without a Bind: a
//! VgpuAllocation the agent writes itself (the mirror of a prepared DRA
//! claim, or of a pod holding static MIG instances), created or replaced and
//! marked Allocated, so `kubectl get vgpuallocations` shows every holder.

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

/// Creates `record` (or finds it from an earlier pass with the same spec)
/// and marks it Allocated, saying `why`, with the MIG instances it holds.
/// One of the same name with another spec is left from an earlier holder
/// (an earlier allocation of the claim, an earlier pod of the name): it is
/// replaced.
pub async fn record(
    client: &Client,
    record: VgpuAllocation,
    why: &str,
    mig_instances: Vec<ServedMigInstance>,
) -> Result<(), Error> {
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
        if same_holder(&found.spec, &record.spec) {
            break found;
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
        return Ok(());
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
    Ok(())
}
