//! Bind's side effects for other vendors' device plugins: the Node's
//! `hami.io/mutex.lock` and the pod annotations the plugin reads
//! ([`Registry::hand_off`](tessera_scheduling::request::Registry::hand_off)
//! decides what they say).

use super::wire::ExtenderBindingArgs;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::Error;
use tessera_api::names::handoff::{BIND_PHASE, MUTEX_LOCK};
use tessera_scheduling::request::Handoff;

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
    if handoff.node.contains_key(MUTEX_LOCK) {
        mutex_free(client, &nodes, args).await?;
    }
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

/// How long another pod's `hami.io/mutex.lock` is honoured (HAMi's
/// `NodeLockTimeout`).
const MUTEX_TIMEOUT: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_mins(5);

/// Refuses the Bind while `hami.io/mutex.lock` names another pod that its
/// plugin has not served yet: still bound to this node, still
/// `bind-phase: allocating`, locked less than 5 minutes ago. The plugins
/// find the pod to serve through the lock, so replacing it would hand that
/// pod this one's devices. (Tessera's NodeLock serialises Binds, but it may
/// expire sooner, at `nodeLockTtlSeconds`.)
async fn mutex_free(
    client: &Client,
    nodes: &Api<Node>,
    args: &ExtenderBindingArgs,
) -> Result<(), Error> {
    let node = nodes
        .get(&args.node)
        .await
        .map_err(Error::kube("reading the node's hami.io/mutex.lock"))?;
    let Some(value) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MUTEX_LOCK))
    else {
        return Ok(());
    };
    let parts: Vec<&str> = value.split(',').collect();
    let [time, namespace, name] = parts.as_slice() else {
        return Ok(()); // not a pod's lock (HAMi's legacy timestamp form): replace it
    };
    if (*namespace, *name) == (args.pod_namespace.as_str(), args.pod_name.as_str()) {
        return Ok(());
    }
    let taken = time.parse::<k8s_openapi::jiff::Timestamp>().ok();
    if taken.is_none_or(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t) > MUTEX_TIMEOUT) {
        return Ok(());
    }
    let holder = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::kube("reading the pod holding hami.io/mutex.lock"))?;
    let waiting = holder.is_some_and(|p| {
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(args.node.as_str())
            && p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(BIND_PHASE))
                .is_some_and(|phase| phase == "allocating")
    });
    if waiting {
        return Err(Error::NoLongerFits {
            node: args.node.clone(),
            reason: format!(
                "hami.io/mutex.lock is held by {namespace}/{name}, which the vendor's device plugin has not served yet"
            ),
        });
    }
    Ok(())
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
