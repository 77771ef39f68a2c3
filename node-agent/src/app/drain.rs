//! Before the agent exits: mark the node, serve what is already bound.

use std::time::Duration;

use tessera_api::v1alpha1::{GpuNode, NodeLock, VgpuAllocation};

/// Before exiting: the GpuNode says `AgentStopping` (so the extender sends
/// no new pod here), then a pod already bound here gets served: wait, up to
/// `limit` in all, until the GpuNode shows it and the node's NodeLock is
/// gone or released (its holder's allocation left `Bound`).
pub(super) async fn drain(client: &kube::Client, node: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    let nodes: kube::Api<GpuNode> = kube::Api::all(client.clone());
    let locks: kube::Api<NodeLock> = kube::Api::all(client.clone());
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
        let locked = match locks.get_opt(node).await {
            Ok(None) => false,
            Ok(Some(lock)) => !released(client, &lock).await,
            Err(_) => true,
        };
        if shown && !locked {
            tracing::info!(node, "drained");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!(
        node,
        seconds = limit.as_secs(),
        "stopping before the node drained"
    );
}

/// Whether the lock's holder was served: its allocation released the lock.
async fn released(client: &kube::Client, lock: &NodeLock) -> bool {
    let allocations: kube::Api<VgpuAllocation> =
        kube::Api::namespaced(client.clone(), &lock.spec.holder.namespace);
    match allocations.get_opt(&lock.spec.allocation).await {
        Ok(Some(a)) => lock.released_by(&a.spec.pod_uid, a.status.and_then(|s| s.phase)),
        _ => false,
    }
}
