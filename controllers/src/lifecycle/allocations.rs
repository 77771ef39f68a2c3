//! Allocations: a VgpuAllocation becomes `Released` as soon as its pod is
//! deleted or finishes (the owner reference then deletes it with the pod),
//! and `Allocated` when its pod runs but the node agent did not record it.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{Controller, controller::Action, reflector::ObjectRef},
};
use serde_json::json;
use tessera_api::v1alpha1::VgpuAllocation;
use tessera_kubekit::Watched;

use super::{Caches, release_reason, retry_cached, served_unrecorded};
use crate::Error;

/// Runs the controller on `allocations`, woken by their `pods`.
pub(super) async fn run(caches: Arc<Caches>, pods: &Watched<Pod>) {
    let allocations = &caches.allocations;
    Controller::for_stream(allocations.touched(), allocations.store())
        .watches_stream(pods.touched(), |pod| {
            Some(ObjectRef::<VgpuAllocation>::new(&pod.name_any()).within(&pod.namespace()?))
        })
        .run(reconcile_allocation, retry_cached, caches)
        .for_each(|_| async {})
        .await;
}

async fn reconcile_allocation(
    allocation: Arc<VgpuAllocation>,
    caches: Arc<Caches>,
) -> Result<Action, Error> {
    if release_reason(&allocation, None).is_none() {
        return Ok(Action::await_change()); // already Released or Failed
    }
    let namespace = allocation.namespace().unwrap_or_default();
    let spec = &allocation.spec;
    let pod = caches
        .pod(&namespace, &spec.pod_name, &spec.pod_uid)
        .await?;
    if let Some(reason) = release_reason(&allocation, pod.as_ref()) {
        let api: Api<VgpuAllocation> = Api::namespaced(caches.client.clone(), &namespace);
        let status = json!({"status": {"phase": "Released", "releasedAt": Timestamp::now().to_string(), "message": reason}});
        match api
            .patch_status(
                &allocation.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(allocation = %allocation.name_any(), %namespace, %reason, "released")
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(Error::kube("marking the allocation Released")(e)),
        }
    } else if served_unrecorded(&allocation, pod.as_ref()) {
        // Guarded by the version read: a concurrent write by the agent wins.
        let api: Api<VgpuAllocation> = Api::namespaced(caches.client.clone(), &namespace);
        let status = json!({
            "metadata": {"resourceVersion": allocation.metadata.resource_version},
            "status": {"phase": "Allocated", "allocatedAt": Timestamp::now().to_string(),
                "message": "the pod's containers started before the node agent recorded its Allocate"},
        });
        match api
            .patch_status(
                &allocation.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(allocation = %allocation.name_any(), %namespace, "marked Allocated: the pod runs")
            }
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(Error::kube("marking the allocation Allocated")(e)),
        }
    }
    Ok(Action::await_change())
}
