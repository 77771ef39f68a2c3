//! Keeps one GpuNode per vendor node: created owned by the Node, labelled
//! [`SOURCE_LABEL`], status applied from [`view::view`]; HAMi's handshake
//! asked for on the Node; a Warning event on the Node for each malformed
//! register annotation (once per value). Runs in the lifecycle leader.
//!
//! A node whose GpuNode the node agent writes (NVIDIA) is left alone: one
//! writer per GpuNode; a node with both NVIDIA GPUs under Tessera's agent
//! and another vendor's devices gets a Warning event instead (not
//! supported yet, docs/vendors.md).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Event, EventSource, Node, ObjectReference},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{Controller, controller::Action},
};
use serde_json::json;
use tessera_api::v1alpha1::{GpuNode, GpuNodeSpec};
use tessera_kubekit::Watched;

use super::{SOURCE_LABEL, Sources, VENDOR_PLUGIN, view};
use crate::Error;

/// How often a vendor node is looked at again (handshakes age without events).
const RECHECK: Duration = Duration::from_secs(15);
/// How long a failed reconcile waits before trying again.
const RETRY: Duration = Duration::from_secs(5);
/// The field manager of vendor GpuNode statuses.
const STATUS: tessera_kubekit::StatusWriter =
    tessera_kubekit::StatusWriter::new("tessera-vendor-view");

struct Context {
    client: Client,
    sources: Sources,
    /// What was last reported per (node, annotation or reason): one Warning
    /// event per distinct value, one entry per key.
    reported: Mutex<HashMap<(String, String), String>>,
}

/// Runs the controller on `nodes` until the future is dropped.
pub(crate) async fn run(client: Client, nodes: &Watched<Node>, sources: Sources) {
    if sources.sources.is_empty() {
        return;
    }
    let context = Arc::new(Context {
        client,
        sources,
        reported: Mutex::default(),
    });
    Controller::for_stream(nodes.touched(), nodes.store())
        .run(
            reconcile,
            |_, error, _| {
                tracing::warn!(%error, "vendor GpuNode failed; retrying");
                Action::requeue(RETRY)
            },
            context,
        )
        .for_each(|_| async {})
        .await;
}

async fn reconcile(node: Arc<Node>, context: Arc<Context>) -> Result<Action, Error> {
    let name = node.name_any();
    let mut annotations = node.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(view::NODE_NAME.to_owned(), name.clone());
    if let Some(instance) = node
        .labels()
        .get(tessera_api::names::neuron::INSTANCE_TYPE_LABEL)
    {
        annotations.insert(view::INSTANCE_TYPE.to_owned(), instance.clone());
    }
    let annotations = &annotations;
    let empty_allocatable = BTreeMap::new();
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .unwrap_or(&empty_allocatable);
    let now = Timestamp::now();
    let api: Api<GpuNode> = Api::all(context.client.clone());
    let current = api
        .get_opt(&name)
        .await
        .map_err(Error::kube("reading the GpuNode"))?;
    let ours =
        |g: &GpuNode| g.labels().get(SOURCE_LABEL).map(String::as_str) == Some(VENDOR_PLUGIN);
    let Some(seen) = view::view(
        annotations,
        allocatable,
        &context.sources.sources,
        context.sources.soft_split_default,
        now,
    ) else {
        if let Some(gpu_node) = current.filter(ours) {
            api.delete(&name, &Default::default())
                .await
                .map_err(Error::kube("deleting a vendor GpuNode"))?;
            tracing::info!(node = %name, "vendor annotations gone; GpuNode deleted");
            drop(gpu_node);
        }
        return Ok(Action::await_change());
    };
    // A node the NVIDIA agent serves is not taken over: say so once, and
    // ask its plugins for nothing.
    if current.as_ref().is_some_and(|g| !ours(g)) {
        if context.first_report(&name, "MixedNodeNotSupported", "") {
            warn(&context.client, &node, "MixedNodeNotSupported", "the node's GpuNode is written by Tessera's node agent (NVIDIA), so the other vendors' devices registered on this Node are not scheduled; a node with NVIDIA GPUs under Tessera and another vendor's devices is not supported yet").await;
        }
        return Ok(Action::requeue(RECHECK * 4));
    }
    for (annotation, error) in &seen.malformed {
        let value = annotations.get(annotation).cloned().unwrap_or_default();
        if context.first_report(&name, annotation, &value) {
            tracing::warn!(node = %name, annotation, error, "malformed register annotation ignored");
            warn(
                &context.client,
                &node,
                "MalformedRegisterAnnotation",
                &format!("annotation {annotation} {error}; its devices are ignored"),
            )
            .await;
        }
    }
    if !seen.handshakes.is_empty() {
        let asked: serde_json::Map<String, serde_json::Value> = seen
            .handshakes
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        Api::<Node>::all(context.client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": asked}})),
            )
            .await
            .map_err(Error::kube("asking vendor plugins for a handshake"))?;
    }
    let previous = match &current {
        Some(g) => g.status.clone(),
        None => {
            let mut object = GpuNode::new(&name, GpuNodeSpec {});
            object.metadata.labels = Some(BTreeMap::from([(
                SOURCE_LABEL.to_owned(),
                VENDOR_PLUGIN.to_owned(),
            )]));
            object.metadata.owner_references = node.controller_owner_ref(&()).map(|mut o| {
                o.controller = Some(false);
                vec![o]
            });
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => tracing::info!(node = %name, "created vendor GpuNode"),
                Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                Err(e) => return Err(Error::kube("creating a vendor GpuNode")(e)),
            }
            None
        }
    };
    let status = view::status(&seen, previous.as_ref(), now);
    if previous.as_ref() != Some(&status) {
        STATUS
            .apply_at(&api, &name, None, &status)
            .await
            .map_err(Error::kube("writing a vendor GpuNode status"))?;
        tracing::info!(node = %name, devices = status.gpu_count, "vendor GpuNode status written");
    }
    Ok(Action::requeue(RECHECK))
}

impl Context {
    /// Whether `value` is new for (node, key): each distinct malformed value
    /// (or condition) is reported once, and only the last value is kept.
    fn first_report(&self, node: &str, key: &str, value: &str) -> bool {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let last = reported.insert((node.to_owned(), key.to_owned()), value.to_owned());
        last.as_deref() != Some(value)
    }
}

/// Records a Warning event on the Node (best effort: a failed event is logged).
async fn warn(client: &Client, node: &Node, reason: &str, message: &str) {
    let now = Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", node.name_any())),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.name_any()),
            uid: node.uid(),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        source: Some(EventSource {
            component: Some("tessera-controller".into()),
            host: None,
        }),
        ..Event::default()
    };
    if let Err(error) = Api::<Event>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &event)
        .await
    {
        tracing::warn!(node = %node.name_any(), reason, %error, "could not record an event");
    }
}
