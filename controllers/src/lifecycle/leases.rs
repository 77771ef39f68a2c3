//! Agent leases: a GpuNode whose agent stopped renewing its Lease
//! (`tessera-agent-<node>`) gets `Ready=Unknown` (`AgentLeaseExpired`) at the
//! moment the Lease lapses, as the node lifecycle controller does for
//! kubelets; the agent's next write replaces it.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    runtime::{Controller, controller::Action},
};
use tessera_api::v1alpha1::{GpuNode, GpuNodeStatus};
use tessera_kubekit::Watched;

use super::caches::RETRY;
use crate::{
    Error,
    lifecycle_rules::{LeaseVerdict, lease_lapsed_conditions, lease_verdict},
};

/// Runs the controller on `leases` (of the agents' namespace).
pub(super) async fn run(client: Client, leases: Watched<Lease>) {
    // The namespace also holds every kubelet's Lease (renewed every 10 s):
    // only the agents' reach the reconciler.
    let lease_events = leases.touched().try_filter(|lease| {
        std::future::ready(crate::projection::agent_node(&lease.name_any()).is_some())
    });
    Controller::for_stream(lease_events, leases.store())
        .run(
            reconcile_agent_lease,
            |_, error, _| {
                tracing::warn!(%error, "marking a GpuNode whose agent Lease lapsed failed; retrying");
                Action::requeue(RETRY)
            },
            Arc::new(client),
        )
        .for_each(|_| async {})
        .await;
}

async fn reconcile_agent_lease(lease: Arc<Lease>, client: Arc<Client>) -> Result<Action, Error> {
    let name = lease.name_any();
    let Some(node) = crate::projection::agent_node(&name) else {
        return Ok(Action::await_change()); // a kubelet's, or another Lease
    };
    let seen = crate::projection::AgentLease::of(&lease);
    let now = Timestamp::now();
    let since = match lease_verdict(seen.renewed, seen.duration_seconds, now) {
        LeaseVerdict::Held { until } => {
            let wait = until.duration_since(now).unsigned_abs();
            return Ok(Action::requeue(wait + Duration::from_millis(100)));
        }
        LeaseVerdict::Lapsed { since } => since,
    };
    let api: Api<GpuNode> = Api::all((*client).clone());
    let Some(gpu_node) = api
        .get_opt(node)
        .await
        .map_err(Error::kube("reading the GpuNode"))?
    else {
        return Ok(Action::await_change());
    };
    let current = gpu_node
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let Some(conditions) = lease_lapsed_conditions(current, &name, since, now) else {
        return Ok(Action::await_change());
    };
    // Only the Ready condition (conditions merge by type: the others stay
    // the agent's). Guarded by the version read: an agent that writes
    // meanwhile is alive.
    let ready = GpuNodeStatus {
        conditions: conditions
            .into_iter()
            .filter(|c| c.type_ == "Ready")
            .collect(),
        ..GpuNodeStatus::default()
    };
    let version = gpu_node.metadata.resource_version.as_deref();
    match crate::STATUS
        .apply_part_at(&api, node, version, &ready)
        .await
    {
        Ok(_) => {
            tracing::warn!(%node, lease = %name, lapsed = %since, "node agent Lease lapsed: GpuNode Ready=Unknown");
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            Ok(Action::requeue(Duration::from_millis(200)))
        }
        Err(e) => Err(Error::kube("marking the GpuNode Ready=Unknown")(e)),
    }
}
