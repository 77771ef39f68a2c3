//! Keeps one GpuNode per vendor node: created owned by the Node, labelled
//! [`SOURCE_LABEL`], status applied from [`view::view`]; HAMi's handshake
//! asked for on the Node; a Warning event on the Node for each malformed
//! register annotation (once per value). Runs in the lifecycle leader.
//!
//! On a node whose GpuNode Tessera's node agent writes (NVIDIA GPUs), the
//! vendor's devices are added to the agent's: the device list merges by
//! uuid under server-side apply, so this controller applies only its
//! devices and a [`VENDOR_READY`] condition under its own field manager,
//! and the agent keeps the rest (summaries, `Ready`, front door). The
//! node's readiness is then the agent's, for every family
//! (docs/vendors.md, mixed nodes). A vendor device whose id is one the
//! agent publishes (an NVIDIA GPU's UUID) is dropped and reported with a
//! Warning, as a malformed register entry is: applied, it would take over
//! the agent's entry of that GPU.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
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
use tessera_api::v1alpha1::{GpuNode, GpuNodeSpec, GpuNodeStatus};
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
/// The condition of a mixed node's vendor devices: what `Ready` says on a
/// node only vendors' plugins serve.
pub const VENDOR_READY: &str = "VendorPluginsReady";

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
    let reserved = current
        .as_ref()
        .filter(|g| agent_writes(g))
        .map(agent_devices)
        .unwrap_or_default();
    let seen = view::view(
        annotations,
        allocatable,
        &context.sources.sources,
        context.sources.soft_split_default,
        &reserved,
        now,
    );
    if let Some(gpu_node) = current.as_ref().filter(|g| agent_writes(g)) {
        // An NVIDIA node; a mixed one when a vendor's plugin registered too.
        let Some(seen) = &seen else {
            mixed(&api, gpu_node, None, now).await?;
            return Ok(Action::await_change());
        };
        tend(&context, &node, annotations, seen).await?;
        mixed(&api, gpu_node, Some(seen), now).await?;
        return Ok(Action::requeue(RECHECK));
    }
    let Some(seen) = seen else {
        if let Some(gpu_node) = current.filter(ours) {
            api.delete(&name, &Default::default())
                .await
                .map_err(Error::kube("deleting a vendor GpuNode"))?;
            tracing::info!(node = %name, "vendor annotations gone; GpuNode deleted");
            drop(gpu_node);
        }
        return Ok(Action::await_change());
    };
    // Someone else's GpuNode whose status the agent has not written yet
    // (it creates the object first): looked at again shortly.
    if current.as_ref().is_some_and(|g| !ours(g)) {
        return Ok(Action::requeue(RECHECK));
    }
    tend(&context, &node, annotations, &seen).await?;
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

/// Whether the node agent writes `gpu_node`'s status (its field manager
/// owns status fields): the node's NVIDIA GPUs are Tessera's.
fn agent_writes(gpu_node: &GpuNode) -> bool {
    gpu_node.managed_fields().iter().any(|entry| {
        entry.manager.as_deref() == Some(tessera_api::names::NODE_AGENT_FIELD_MANAGER)
            && entry.subresource.as_deref() == Some("status")
    })
}

/// The device ids the node's agent publishes in `gpu_node`: its NVIDIA
/// devices, and every device entry its status field manager owns fields of
/// (an entry a vendor's apply has already taken over still lists the agent,
/// while its family reads as the vendor's).
fn agent_devices(gpu_node: &GpuNode) -> BTreeSet<String> {
    let mut ids: BTreeSet<String> = gpu_node
        .status
        .iter()
        .flat_map(|s| &s.devices)
        .filter(|d| d.family.is_nvidia())
        .map(|d| d.uuid.clone())
        .collect();
    let agents = gpu_node.managed_fields().iter().filter(|entry| {
        entry.manager.as_deref() == Some(tessera_api::names::NODE_AGENT_FIELD_MANAGER)
            && entry.subresource.as_deref() == Some("status")
    });
    for entry in agents {
        let Some(devices) = entry
            .fields_v1
            .as_ref()
            .and_then(|f| f.0.get("f:status"))
            .and_then(|s| s.get("f:devices"))
            .and_then(serde_json::Value::as_object)
        else {
            continue;
        };
        // Keys of a list merged by uuid: `k:{"uuid":"GPU-0"}`.
        let keyed = devices
            .keys()
            .filter_map(|k| k.strip_prefix("k:"))
            .filter_map(|k| serde_json::from_str::<serde_json::Value>(k).ok())
            .filter_map(|k| k.get("uuid")?.as_str().map(str::to_owned));
        ids.extend(keyed);
    }
    ids
}

/// One Warning event the view calls for.
#[derive(Debug, PartialEq, Eq)]
struct Warning {
    /// What it is about (an annotation, or an annotation and a device id):
    /// one event per distinct value of it.
    key: String,
    /// The value it is about: the annotation's.
    value: String,
    /// The event's reason.
    reason: &'static str,
    /// The event's message.
    message: String,
}

/// The Warning events `seen` calls for on a Node with `annotations`: one
/// per malformed register annotation, one per device dropped because its id
/// is the agent's.
fn warnings(seen: &view::VendorView, annotations: &BTreeMap<String, String>) -> Vec<Warning> {
    let value = |annotation: &str| annotations.get(annotation).cloned().unwrap_or_default();
    let malformed = seen.malformed.iter().map(|(annotation, error)| Warning {
        key: annotation.clone(),
        value: value(annotation),
        reason: "MalformedRegisterAnnotation",
        message: format!("annotation {annotation} {error}; its devices are ignored"),
    });
    let collisions = seen.collisions.iter().map(|(annotation, id)| Warning {
        key: format!("{annotation} {id}"),
        value: value(annotation),
        reason: "MalformedRegisterAnnotation",
        message: view::collision_message(annotation, id),
    });
    malformed.chain(collisions).collect()
}

/// The part of a mixed node's status this controller writes: the vendors'
/// devices (every family but NVIDIA) and the [`VENDOR_READY`] condition.
fn vendor_part(status: Option<&GpuNodeStatus>) -> GpuNodeStatus {
    let Some(status) = status else {
        return GpuNodeStatus::default();
    };
    GpuNodeStatus {
        devices: status
            .devices
            .iter()
            .filter(|d| !d.family.is_nvidia())
            .cloned()
            .collect(),
        conditions: status
            .conditions
            .iter()
            .filter(|c| c.type_ == VENDOR_READY)
            .cloned()
            .collect(),
        ..GpuNodeStatus::default()
    }
}

/// What this controller writes on a mixed node: the devices `seen` (none
/// when the vendors' annotations are gone) and their condition.
fn mixed_status(
    seen: Option<&view::VendorView>,
    previous: &GpuNodeStatus,
    now: Timestamp,
) -> GpuNodeStatus {
    let Some(seen) = seen else {
        return GpuNodeStatus::default();
    };
    GpuNodeStatus {
        devices: seen.devices.clone(),
        conditions: vec![view::condition(
            seen,
            VENDOR_READY,
            previous.conditions.first(),
            now,
        )],
        ..GpuNodeStatus::default()
    }
}

/// Adds the vendors' devices to the agent's GpuNode (or takes them away),
/// writing only [`vendor_part`]: server-side apply merges the device list
/// by uuid, and the fields this controller leaves out stay the agent's.
async fn mixed(
    api: &Api<GpuNode>,
    gpu_node: &GpuNode,
    seen: Option<&view::VendorView>,
    now: Timestamp,
) -> Result<(), Error> {
    let name = gpu_node.name_any();
    let previous = vendor_part(gpu_node.status.as_ref());
    let wanted = mixed_status(seen, &previous, now);
    if wanted != previous {
        STATUS
            .apply_part_at(api, &name, None, &wanted)
            .await
            .map_err(Error::kube("adding vendor devices to the agent's GpuNode"))?;
        tracing::info!(node = %name, devices = wanted.devices.len(), "vendor devices written beside the agent's");
    }
    Ok(())
}

/// What a vendor node asks of its plugins and reports, whoever writes its
/// GpuNode: a Warning event per malformed register annotation and per
/// device dropped as the agent's (once per value), and the handshakes the
/// view asks for.
async fn tend(
    context: &Context,
    node: &Node,
    annotations: &BTreeMap<String, String>,
    seen: &view::VendorView,
) -> Result<(), Error> {
    let name = node.name_any();
    for warning in warnings(seen, annotations) {
        if context.first_report(&name, &warning.key, &warning.value) {
            tracing::warn!(node = %name, key = %warning.key, message = %warning.message, "vendor register entry ignored");
            warn(&context.client, node, warning.reason, &warning.message).await;
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
    Ok(())
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

#[cfg(test)]
mod tests {
    use tessera_api::v1alpha1::{DeviceFamily, GpuDevice};

    use super::*;

    fn device(uuid: &str, family: DeviceFamily) -> GpuDevice {
        GpuDevice {
            uuid: uuid.into(),
            family,
            ..GpuDevice::default()
        }
    }

    #[test]
    fn the_agent_s_gpunode_is_told_by_its_status_field_manager() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let entry = |manager: &str, subresource: Option<&str>| ManagedFieldsEntry {
            manager: Some(manager.into()),
            subresource: subresource.map(Into::into),
            ..ManagedFieldsEntry::default()
        };
        let mut gpu_node = GpuNode::new("n", GpuNodeSpec {});
        assert!(!agent_writes(&gpu_node));
        // Created by the agent, status not written yet: not yet the agent's.
        gpu_node.metadata.managed_fields = Some(vec![entry(
            tessera_api::names::NODE_AGENT_FIELD_MANAGER,
            None,
        )]);
        assert!(!agent_writes(&gpu_node));
        gpu_node.metadata.managed_fields = Some(vec![
            entry("tessera-vendor-view", Some("status")),
            entry(tessera_api::names::NODE_AGENT_FIELD_MANAGER, Some("status")),
        ]);
        assert!(agent_writes(&gpu_node));
        gpu_node.metadata.managed_fields = Some(vec![entry("tessera-vendor-view", Some("status"))]);
        assert!(!agent_writes(&gpu_node));
    }

    /// Review finding M7: on a mixed node, a register entry whose id is the
    /// UUID of a GPU the agent publishes is dropped with one Warning, and
    /// the vendor's other devices stay.
    #[test]
    fn a_vendor_device_named_as_the_agent_s_gpu_is_dropped_with_one_warning() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        use tessera_scheduling::request::{HygonConfig, RequestConfig};
        let now: Timestamp = "2026-12-02T10:00:00Z".parse().unwrap();
        let mut gpu_node = GpuNode::new("n", GpuNodeSpec {});
        gpu_node.status = Some(GpuNodeStatus::of_devices(vec![device(
            "GPU-X",
            DeviceFamily::Nvidia,
        )]));
        let mut annotations = BTreeMap::from([(
            tessera_api::names::hygon::REGISTER.to_owned(),
            "GPU-X,4,16384,100,DCU,0,true:DCU-1,4,16384,100,DCU,0,true:".to_owned(),
        )]);
        let sources = view::sources(&RequestConfig {
            hygon: Some(HygonConfig::default()),
            ..RequestConfig::default()
        });
        let look = |gpu_node: &GpuNode, annotations: &BTreeMap<String, String>| {
            let reserved = agent_devices(gpu_node);
            view::view(
                annotations,
                &BTreeMap::new(),
                &sources,
                false,
                &reserved,
                now,
            )
            .unwrap()
        };
        let seen = look(&gpu_node, &annotations);
        let ids: Vec<&str> = seen.devices.iter().map(|d| d.uuid.as_str()).collect();
        assert_eq!(ids, ["DCU-1"], "no vendor device GPU-X");
        let warned = warnings(&seen, &annotations);
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert_eq!(warned[0].reason, "MalformedRegisterAnnotation");
        assert!(
            warned[0]
                .message
                .contains("names device \"GPU-X\", which the node agent publishes"),
            "{}",
            warned[0].message
        );
        let condition = view::condition(&seen, VENDOR_READY, None, now);
        assert_eq!(condition.reason, "SomeSourcesIgnored");
        // What is written beside the agent's devices leaves GPU-X alone.
        let wanted = mixed_status(Some(&seen), &GpuNodeStatus::default(), now);
        assert!(wanted.devices.iter().all(|d| d.uuid != "GPU-X"));

        // Already taken over (the element reads as the vendor's): the
        // agent's field manager still keys GPU-X, so it stays the agent's.
        gpu_node.status = Some(GpuNodeStatus::of_devices(vec![device(
            "GPU-X",
            DeviceFamily::Hygon,
        )]));
        gpu_node.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(tessera_api::names::NODE_AGENT_FIELD_MANAGER.into()),
            subresource: Some("status".into()),
            fields_v1: Some(FieldsV1(json!({"f:status": {"f:devices": {
                "k:{\"uuid\":\"GPU-X\"}": {".": {}, "f:minor": {}},
            }}}))),
            ..ManagedFieldsEntry::default()
        }]);
        assert_eq!(
            agent_devices(&gpu_node),
            BTreeSet::from(["GPU-X".to_owned()])
        );
        assert_eq!(look(&gpu_node, &annotations).collisions.len(), 1);

        // Without the collision: both devices, no warning.
        annotations.insert(
            tessera_api::names::hygon::REGISTER.to_owned(),
            "DCU-0,4,16384,100,DCU,0,true:DCU-1,4,16384,100,DCU,0,true:".to_owned(),
        );
        let clean = look(&gpu_node, &annotations);
        assert_eq!(clean.devices.len(), 2);
        assert!(warnings(&clean, &annotations).is_empty());
    }

    #[test]
    fn on_a_mixed_node_only_the_vendor_s_devices_and_condition_are_written() {
        let now: Timestamp = "2026-11-28T10:00:00Z".parse().unwrap();
        let seen = view::VendorView {
            devices: vec![device("npu-0", DeviceFamily::Ascend)],
            ..view::VendorView::default()
        };
        // The agent's GpuNode: its GPU, its summaries and its Ready.
        let mut agents = GpuNodeStatus::of_devices(vec![device("GPU-0", DeviceFamily::Nvidia)]);
        agents.conditions = vec![view::condition(&seen, "Ready", None, now)];
        assert_eq!(vendor_part(Some(&agents)), GpuNodeStatus::default());

        let wanted = mixed_status(Some(&seen), &vendor_part(Some(&agents)), now);
        assert_eq!(wanted.devices, seen.devices);
        assert_eq!(wanted.conditions.len(), 1);
        assert_eq!(
            (
                wanted.conditions[0].type_.as_str(),
                wanted.conditions[0].status.as_str()
            ),
            (VENDOR_READY, "True")
        );
        // Nothing of the agent's is claimed: summaries stay unset, so the
        // partial apply sends only the devices and the condition.
        assert_eq!((wanted.gpu_count, wanted.models.as_str()), (0, ""));

        // Once merged, the vendor's part reads back as written, and the
        // condition keeps its transition time while its state holds.
        let mut merged = agents.clone();
        merged.devices.extend(wanted.devices.clone());
        merged.conditions.extend(wanted.conditions.clone());
        assert_eq!(vendor_part(Some(&merged)), wanted);
        let later = now + std::time::Duration::from_secs(60);
        assert_eq!(
            mixed_status(Some(&seen), &vendor_part(Some(&merged)), later),
            wanted
        );
        // The plugins' annotations gone: an empty part, which takes the
        // devices and the condition away.
        assert_eq!(
            mixed_status(None, &vendor_part(Some(&merged)), later),
            GpuNodeStatus::default()
        );
    }
}
