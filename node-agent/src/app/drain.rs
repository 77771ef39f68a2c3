//! Before the agent exits: mark the node, serve what is already bound, and
//! keep the node closed until the agent starts again.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api,
    api::{DeleteParams, PostParams, Preconditions},
};
use tessera_api::v1alpha1::{
    GpuNode, MAX_LOCK_TTL_SECONDS, NodeLock, PodReference, VgpuAllocation,
};

/// Who holds a stopping agent's lock.
pub(super) struct Agent {
    /// The agent: its Lease's namespace and name, and its pod's UID (or
    /// the Lease's name when it runs in no pod).
    pub(super) reference: PodReference,
    /// Its Lease's name (the lock's `allocation`).
    pub(super) lease: String,
}

/// Before exiting: the GpuNode says `AgentStopping` (so the extender sends
/// no new pod here), then a pod already bound here gets served, and the
/// agent takes the node's NodeLock itself (`draining`), so that no Bind
/// that missed the mark can bind a pod here after it: wait, up to `limit`
/// in all, until the GpuNode shows the mark and the lock is the agent's.
/// While a pod holds the lock (its holder's allocation still `Bound`) the
/// agent serves it first.
pub(super) async fn drain(client: &kube::Client, node: &str, agent: &Agent, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    let nodes: Api<GpuNode> = Api::all(client.clone());
    let marked = |n: &GpuNode| {
        n.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "AgentStopping")
        })
    };
    tracing::info!(
        node,
        "stopping: marking the node not Ready and serving any pod bound here"
    );
    while tokio::time::Instant::now() < deadline {
        let shown = nodes
            .get_opt(node)
            .await
            .ok()
            .flatten()
            .is_some_and(|n| marked(&n));
        if shown {
            match close(client, node, agent).await {
                Ok(true) => {
                    tracing::info!(node, "drained: the node's NodeLock is the stopping agent's");
                    return;
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, node, "taking the node's NodeLock"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!(
        node,
        seconds = limit.as_secs(),
        "stopping before the node drained"
    );
}

/// Takes the node's lock for the stopping agent, conditional on the
/// version judged free (none, released by its holder's allocation, or
/// expired); false while a pod holds it.
async fn close(client: &kube::Client, node: &str, agent: &Agent) -> Result<bool, kube::Error> {
    let locks: Api<NodeLock> = Api::all(client.clone());
    let mut wanted = NodeLock::draining(
        node,
        &agent.reference,
        &agent.lease,
        MAX_LOCK_TTL_SECONDS,
        Timestamp::now(),
    );
    let current = locks.get_opt(node).await?;
    let Some(current) = current else {
        return match locks.create(&PostParams::default(), &wanted).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
            Err(e) => Err(e),
        };
    };
    if current.spec.draining {
        return Ok(true); // an earlier stop of this agent left it
    }
    let free = current.spec.expires_at.0 <= Timestamp::now() || released(client, &current).await?;
    if !free {
        return Ok(false);
    }
    wanted.metadata.resource_version = current.metadata.resource_version;
    match locks.replace(node, &PostParams::default(), &wanted).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the lock's holder was served: its allocation released the lock.
async fn released(client: &kube::Client, lock: &NodeLock) -> Result<bool, kube::Error> {
    let allocations: Api<VgpuAllocation> =
        Api::namespaced(client.clone(), &lock.spec.holder.namespace);
    let allocation = allocations.get_opt(&lock.spec.allocation).await?;
    Ok(!lock.held_among(allocation.as_slice()))
}

/// At start: deletes the lock an earlier stop of this node's agent took,
/// exactly that version, so pods may be bound here again.
pub(super) async fn reopen(client: &kube::Client, node: &str) {
    let locks: Api<NodeLock> = Api::all(client.clone());
    let Ok(Some(lock)) = locks.get_opt(node).await else {
        return;
    };
    if !lock.spec.draining {
        return;
    }
    let exact = DeleteParams::default().preconditions(Preconditions {
        uid: lock.metadata.uid.clone(),
        resource_version: lock.metadata.resource_version.clone(),
    });
    match locks.delete(node, &exact).await {
        Ok(_) => tracing::info!(
            node,
            "reopened the node: deleted the NodeLock a stopping agent took"
        ),
        Err(error) => {
            tracing::warn!(%error, node, "could not delete the NodeLock a stopping agent took")
        }
    }
}
