//! Bind's side effects for other vendors' device plugins: the Node's
//! `hami.io/mutex.lock` and the pod annotations the plugin reads
//! ([`crate::vendors::handoff`] decides what they say).

use std::collections::BTreeMap;

use super::wire::ExtenderBindingArgs;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::Error;

/// Writes what a vendor plugin reads: the Node's lock annotations for this
/// pod (`node`: `hami.io/mutex.lock`, Cambricon's `cambricon.com/dsmlu.lock`;
/// Tessera's NodeLock already serialises Binds on the node, so a value left
/// by an earlier pod is replaced), then the pod's annotations.
pub(super) async fn hand_off(
    client: &Client,
    pods: &Api<Pod>,
    args: &ExtenderBindingArgs,
    handoff: &Handoff,
) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &args.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": handoff.node}})),
        )
        .await
        .map_err(Error::kube("taking the node's vendor lock annotations"))?;
    pods.patch(
        &args.pod_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": handoff.pod}})),
    )
    .await
    .map_err(Error::kube("writing the vendor plugin's pod annotations"))?;
    Ok(())
}

/// What Bind hands to other vendors' plugins: pod and Node annotations.
#[derive(Debug, Default)]
pub(super) struct Handoff {
    /// The pod's annotations.
    pub pod: BTreeMap<String, String>,
    /// The Node's (its locks).
    pub node: BTreeMap<String, String>,
}

impl Handoff {
    /// Whether there is anything to hand over (a pod of NVIDIA GPUs only: no).
    pub fn is_empty(&self) -> bool {
        self.pod.is_empty() && self.node.is_empty()
    }
}

/// Undoes [`hand_off`] after a failed Bind (best effort: what cannot be
/// undone is logged; the plugin acts only on a pod bound to its node).
/// A Node lock is removed only while it still says what this Bind wrote.
pub(super) async fn take_back(
    client: &Client,
    pods: &Api<Pod>,
    args: &ExtenderBindingArgs,
    handoff: &Handoff,
) {
    let cleared: serde_json::Map<String, serde_json::Value> = handoff
        .pod
        .keys()
        .map(|k| (k.clone(), serde_json::Value::Null))
        .collect();
    if let Err(error) = pods
        .patch(
            &args.pod_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": cleared}})),
        )
        .await
    {
        tracing::warn!(pod = %args.pod_name, %error, "could not remove the vendor annotations of a failed Bind");
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get_opt(&args.node)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.metadata.annotations)
        .unwrap_or_default();
    let ours: serde_json::Map<String, serde_json::Value> = handoff
        .node
        .iter()
        .filter(|(k, v)| current.get(*k) == Some(*v))
        .map(|(k, _)| (k.clone(), serde_json::Value::Null))
        .collect();
    if !ours.is_empty()
        && let Err(error) = nodes
            .patch(
                &args.node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": ours}})),
            )
            .await
    {
        tracing::warn!(node = %args.node, %error, "could not release the vendor lock after a failed Bind");
    }
}
