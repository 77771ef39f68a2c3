//! Allocations: a VgpuAllocation becomes `Released` as soon as its pod is
//! deleted or finishes (the owner reference then deletes it with the pod),
//! and `Allocated` when its pod runs but the node agent did not record it.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller::Action, reflector::ObjectRef},
};
use tessera_api::v1alpha1::{AllocationPhase, VgpuAllocation, VgpuAllocationStatus};
use tessera_kubekit::Watched;

use super::caches::{Caches, retry_cached};
use crate::{
    Error,
    lean_pod::LeanPod,
    lifecycle_rules::{HOLD_LAPSED, hold_expiry, release_reason, served_unrecorded},
};

/// How soon a release that met a newer version of its allocation (the
/// agent wrote meanwhile) is tried again, once the watch has brought it.
const AGAIN: Duration = Duration::from_millis(200);

/// Runs the controller on `allocations`, woken by their `pods`.
pub(super) async fn run(caches: Arc<Caches>, pods: &Watched<LeanPod>) {
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
    let api: Api<VgpuAllocation> = Api::namespaced(caches.client.clone(), &namespace);
    let name = allocation.name_any();
    let version = allocation.metadata.resource_version.as_deref();
    let now = Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default());
    let lapsed = hold_expiry(&allocation).map(|at| (at, at <= now.0));
    let reason = release_reason(&allocation, pod.as_ref())
        .or_else(|| lapsed.filter(|l| l.1).map(|_| HOLD_LAPSED.to_owned()));
    if let Some(reason) = reason {
        // Everything this controller may own in the status, so the apply
        // removes none of it: `allocatedAt` is carried when set (by the
        // fallback below, or by the agent). Guarded by the version read,
        // so what is carried is current; a newer version is read next time.
        let released = VgpuAllocationStatus {
            phase: Some(AllocationPhase::Released),
            released_at: Some(now),
            message: Some(reason.clone()),
            allocated_at: allocation
                .status
                .as_ref()
                .and_then(|s| s.allocated_at.clone()),
            ..VgpuAllocationStatus::default()
        };
        match crate::STATUS
            .apply_at(&api, &name, version, &released)
            .await
        {
            Ok(_) => tracing::info!(allocation = %name, %namespace, %reason, "released"),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(Action::requeue(AGAIN)),
            Err(e) => return Err(Error::kube("marking the allocation Released")(e)),
        }
    } else if served_unrecorded(&allocation, pod.as_ref()) {
        // Guarded by the version read: a concurrent write by the agent wins.
        let allocated = VgpuAllocationStatus {
            phase: Some(AllocationPhase::Allocated),
            allocated_at: Some(now),
            message: Some(
                "the pod's containers started before the node agent recorded its Allocate"
                    .to_owned(),
            ),
            ..VgpuAllocationStatus::default()
        };
        match crate::STATUS
            .apply_at(&api, &name, version, &allocated)
            .await
        {
            Ok(_) => {
                tracing::info!(allocation = %name, %namespace, "marked Allocated: the pod runs")
            }
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(Error::kube("marking the allocation Allocated")(e)),
        }
    } else if let Some((at, _)) = lapsed {
        // A hold for a preemptor: look again when it lapses.
        let left = at.duration_since(now.0).unsigned_abs();
        return Ok(Action::requeue(left + Duration::from_secs(1)));
    }
    Ok(Action::await_change())
}
