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
//! as [`Waiters`]; when this replica's projection then sees capacity appear
//! on it, it writes the annotation [`GPU_FREED`] on the Node, once per
//! round of rejections. The replica that rejected is the one whose
//! kube-scheduler is waiting, and it writes only after its own ledger holds
//! the change, so the retry it causes cannot be answered from older state.
//! Nodes no pod was turned away from are never written.

use std::{collections::BTreeSet, sync::Mutex};

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

/// Nodes a GPU pod was turned away from since they were last nudged.
#[derive(Debug, Default)]
pub struct Waiters {
    nodes: Mutex<BTreeSet<String>>,
}

impl Waiters {
    fn nodes(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that pods were turned away from `nodes`. Filter calls this
    /// while it still holds the ledger's read lock, so a change applied
    /// after its decision finds the record.
    pub fn record<'a>(&self, nodes: impl IntoIterator<Item = &'a str>) {
        let mut waiting = self.nodes();
        for node in nodes {
            if !waiting.contains(node) {
                waiting.insert(node.to_owned());
            }
        }
    }

    /// Whether pods were waiting for `node`; forgets them.
    pub fn take(&self, node: &str) -> bool {
        self.nodes().remove(node)
    }

    /// Every node pods were waiting for; forgets them.
    pub fn take_all(&self) -> Vec<String> {
        std::mem::take(&mut *self.nodes()).into_iter().collect()
    }

    /// Whether pods wait for `node` (for tests and metrics).
    pub fn contains(&self, node: &str) -> bool {
        self.nodes().contains(node)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_of_rejections_is_nudged_once() {
        let waiters = Waiters::default();
        assert!(!waiters.take("n1"), "nobody waits: no write");
        waiters.record(["n1", "n2", "n1"]);
        assert!(waiters.contains("n1"));
        assert!(waiters.take("n1"));
        assert!(!waiters.take("n1"), "once per round");
        waiters.record(["n3"]);
        assert_eq!(waiters.take_all(), ["n2", "n3"]);
        assert!(waiters.take_all().is_empty());
    }
}
