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

/// Writes what a vendor plugin reads: the Node's `hami.io/mutex.lock` for
/// this pod (Tessera's NodeLock already serialises Binds on the node, so a
/// value left by an earlier pod is replaced), then the pod's annotations.
pub(super) async fn hand_off(
    client: &Client,
    pods: &Api<Pod>,
    args: &ExtenderBindingArgs,
    annotations: &BTreeMap<String, String>,
) -> Result<(), Error> {
    use crate::vendors::handoff::{MUTEX_LOCK, mutex_value};
    let mutex = mutex_value(
        &args.pod_namespace,
        &args.pod_name,
        k8s_openapi::jiff::Timestamp::now(),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &args.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {MUTEX_LOCK: mutex}}})),
        )
        .await
        .map_err(Error::kube("taking the node's hami.io/mutex.lock"))?;
    pods.patch(
        &args.pod_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
    )
    .await
    .map_err(Error::kube("writing the vendor plugin's pod annotations"))?;
    Ok(())
}

/// Undoes [`hand_off`] after a failed Bind (best effort: what cannot be
/// undone is logged; the plugin acts only on a pod bound to its node).
pub(super) async fn take_back(
    client: &Client,
    pods: &Api<Pod>,
    args: &ExtenderBindingArgs,
    annotations: &BTreeMap<String, String>,
) {
    use crate::vendors::handoff::{MUTEX_LOCK, mutex_held_by};
    let cleared: serde_json::Map<String, serde_json::Value> = annotations
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
    let ours = nodes
        .get_opt(&args.node)
        .await
        .ok()
        .flatten()
        .is_some_and(|n| {
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(MUTEX_LOCK))
                .is_some_and(|v| mutex_held_by(v, &args.pod_namespace, &args.pod_name))
        });
    if ours
        && let Err(error) = nodes
            .patch(
                &args.node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {MUTEX_LOCK: null}}})),
            )
            .await
    {
        tracing::warn!(node = %args.node, %error, "could not release hami.io/mutex.lock after a failed Bind");
    }
}
