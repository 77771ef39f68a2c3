//! The pods a plugin looks at: those bound to its node.

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams};

/// The node's pods (`spec.nodeName`), only those in `phase` when given.
pub async fn pods_on(client: &Client, node: &str, phase: Option<&str>) -> Result<Vec<Pod>, String> {
    let mut selector = format!("spec.nodeName={node}");
    if let Some(phase) = phase {
        selector.push_str(&format!(",status.phase={phase}"));
    }
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items)
        .map_err(|e| format!("failed to list the pods assigned to node {node}: {e}"))
}

/// Those of `pods` still Pending (the kubelet allocates before it starts a
/// pod's containers).
pub fn pending(pods: &[Pod]) -> Vec<Pod> {
    pods.iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        .cloned()
        .collect()
}

/// The node's pending pods, as the plugins that find their pod themselves
/// list them.
pub async fn pending_on(client: &Client, node: &str) -> Result<Vec<Pod>, String> {
    pods_on(client, node, Some("Pending")).await
}
