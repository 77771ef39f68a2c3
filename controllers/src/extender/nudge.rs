//! Telling kube-scheduler that a node it was turned away from can take pods
//! again.
//!
//! kube-scheduler watches Nodes and Pods, not Tessera's objects: when the
//! extender rejects nodes for a pod, kube-scheduler (v1.36) records the
//! pseudo-plugin `Extender` as the pod's rejector, and that plugin asks to
//! be retried on every change of a Node (any field, annotations included:
//! `UpdateNodeAnnotation`) or a Pod. An allocation turning `Released`, a
//! GpuNode gaining capacity or becoming Ready, or an agent pod becoming
//! ready again are none of those, so without help a waiting pod waits for
//! the scheduler's periodic flush of unschedulable pods (5 minutes).
//!
//! So every Filter that turns a GPU pod away from a node records the node
//! as waiting (`projection::Waiters`); when this replica's projection then
//! sees capacity appear on it, it reports the node
//! (`Projection::take_freed_nodes`) and [`nudge_nodes`] writes the
//! annotation [`GPU_FREED`] on the Node, once per round of rejections. The replica that rejected is the one whose
//! kube-scheduler is waiting, and it writes only after its own ledger holds
//! the change, so the retry it causes cannot be answered from older state.
//! Nodes no pod was turned away from are never written.

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio::sync::mpsc;

/// The Node annotation the extender's replica bumps (to the time) when
/// capacity appears on a node that pods were turned away from.
pub const GPU_FREED: &str = "tessera.dev/gpu-freed";

/// Writes [`GPU_FREED`] on each Node received, in order; a failed write is
/// logged and dropped (the pod is then retried at kube-scheduler's flush).
pub async fn nudge_nodes(client: Client, mut nodes: mpsc::UnboundedReceiver<String>) {
    let api: Api<Node> = Api::all(client);
    while let Some(node) = nodes.recv().await {
        let now = Timestamp::now().to_string();
        let patch = json!({"metadata": {"annotations": {GPU_FREED: now}}});
        match api
            .patch(&node, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => tracing::debug!(%node, "told kube-scheduler the node has room again"),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(error) => {
                tracing::warn!(%node, %error, "could not annotate the Node; waiting pods are retried at kube-scheduler's next flush");
            }
        }
    }
}
