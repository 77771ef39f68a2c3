//! Lifecycle controllers, event-driven (kube-runtime):
//!
//! - allocations: a VgpuAllocation becomes `Released` as soon as its pod is
//!   deleted or finishes (the owner reference then deletes it with the pod);
//! - locks: a NodeLock is deleted as soon as its holder is deleted, finished,
//!   bound elsewhere, or served, and at its expiry otherwise;
//! - configs: each GpuNodeConfig's status lists the nodes it selects and its
//!   conflicts with configs of equal priority;
//! - agent leases: a GpuNode whose agent stopped renewing its Lease
//!   (`tessera-agent-<node>`) gets `Ready=Unknown` (`AgentLeaseExpired`) at
//!   the moment the Lease lapses, as the node lifecycle controller does for
//!   kubelets; the agent's next write replaces it.

mod decide;

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, Pod},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store, reflector},
        watcher,
    },
};
use serde_json::json;
use tessera_api::{
    node_config::resolve,
    v1alpha1::{
        GpuNode, GpuNodeConfig, GpuNodeConfigStatus, NodeLock, NodeSettings, VgpuAllocation,
    },
};

pub use decide::{
    AGENT_LEASE_EXPIRED, DEFAULT_LEASE_SECONDS, LeaseVerdict, LockAction, admitted,
    lease_lapsed_conditions, lease_verdict, lock_action, release_reason, served_unrecorded,
};

use crate::Error;

/// How long a failed reconcile waits before trying again.
const RETRY: Duration = Duration::from_secs(5);

/// Runs the controllers until the process stops, with the agents' Leases
/// in `kube-node-lease`.
pub async fn run(client: Client) {
    run_with(client, Some("kube-node-lease".to_owned())).await;
}

/// Runs the controllers until the process stops; the agents' Leases are
/// watched in `agent_lease_namespace` (`None`: not watched).
pub async fn run_with(client: Client, agent_lease_namespace: Option<String>) {
    let leases = async {
        if let Some(namespace) = agent_lease_namespace {
            agent_leases(client.clone(), namespace).await;
        }
    };
    tokio::join!(
        allocations(client.clone()),
        locks(client.clone()),
        configs(client.clone()),
        leases,
    );
}

async fn agent_leases(client: Client, namespace: String) {
    let (leases, lease_events) = cached(Api::<Lease>::namespaced(client.clone(), &namespace));
    // The namespace also holds every kubelet's Lease (renewed every 10 s):
    // only the agents' reach the reconciler.
    let lease_events = lease_events.try_filter(|lease| {
        std::future::ready(crate::projection::agent_node(&lease.name_any()).is_some())
    });
    Controller::for_stream(lease_events, leases)
        .run(
            reconcile_agent_lease,
            |_, error, _| {
                tracing::warn!(%error, "marking a GpuNode whose agent Lease lapsed failed; retrying");
                Action::requeue(RETRY)
            },
            Arc::new(client),
        )
        .for_each(|_| async {})
        .await;
}

async fn reconcile_agent_lease(lease: Arc<Lease>, client: Arc<Client>) -> Result<Action, Error> {
    let name = lease.name_any();
    let Some(node) = crate::projection::agent_node(&name) else {
        return Ok(Action::await_change()); // a kubelet's, or another Lease
    };
    let seen = crate::projection::AgentLease::of(&lease);
    let now = Timestamp::now();
    let since = match lease_verdict(seen.renewed, seen.duration_seconds, now) {
        LeaseVerdict::Held { until } => {
            let wait = until.duration_since(now).unsigned_abs();
            return Ok(Action::requeue(wait + Duration::from_millis(100)));
        }
        LeaseVerdict::Lapsed { since } => since,
    };
    let api: Api<GpuNode> = Api::all((*client).clone());
    let Some(gpu_node) = api
        .get_opt(node)
        .await
        .map_err(Error::kube("reading the GpuNode"))?
    else {
        return Ok(Action::await_change());
    };
    let current = gpu_node
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let Some(conditions) = lease_lapsed_conditions(current, &name, since, now) else {
        return Ok(Action::await_change());
    };
    // Guarded by the version read: an agent that writes meanwhile is alive.
    let patch = json!({
        "metadata": {"resourceVersion": gpu_node.metadata.resource_version},
        "status": {"conditions": conditions},
    });
    match api
        .patch_status(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            tracing::warn!(%node, lease = %name, lapsed = %since, "node agent Lease lapsed: GpuNode Ready=Unknown");
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            Ok(Action::requeue(Duration::from_millis(200)))
        }
        Err(e) => Err(Error::kube("marking the GpuNode Ready=Unknown")(e)),
    }
}

/// A watch of every `K`, kept in a store that is updated before each event
/// is passed on, so a reconciler triggered by the event reads it from the cache.
fn cached<K>(
    api: Api<K>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    (store, events)
}

/// The cached objects a reconciler decides from: no API read per reconcile.
struct Caches {
    client: Client,
    pods: Store<Pod>,
    allocations: Store<VgpuAllocation>,
}

impl Caches {
    /// The pod `namespace/name` from the cache; when the cache has no such
    /// pod (or another incarnation), the API server confirms before anyone
    /// acts on "the pod is gone".
    async fn pod(&self, namespace: &str, name: &str, uid: &str) -> Result<Option<Pod>, Error> {
        let cached = self.pods.get(&ObjectRef::new(name).within(namespace));
        if let Some(pod) = cached.filter(|p| p.metadata.uid.as_deref() == Some(uid)) {
            return Ok(Some((*pod).clone()));
        }
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(Error::kube("reading the pod"))
    }
}

fn retry_cached<K>(_: Arc<K>, error: &Error, _: Arc<Caches>) -> Action {
    tracing::warn!(%error, "reconcile failed; retrying");
    Action::requeue(RETRY)
}

async fn allocations(client: Client) {
    let (allocations, allocation_events) = cached(Api::<VgpuAllocation>::all(client.clone()));
    let (pods, pod_events) = cached(Api::<Pod>::all(client.clone()));
    let caches = Arc::new(Caches {
        client,
        pods,
        allocations: allocations.clone(),
    });
    Controller::for_stream(allocation_events, allocations)
        .watches_stream(pod_events, |pod| {
            Some(ObjectRef::<VgpuAllocation>::new(&pod.name_any()).within(&pod.namespace()?))
        })
        .run(reconcile_allocation, retry_cached, caches)
        .for_each(|_| async {})
        .await;
}

async fn reconcile_allocation(
    allocation: Arc<VgpuAllocation>,
    caches: Arc<Caches>,
) -> Result<Action, Error> {
    if release_reason(&allocation, None).is_none() {
        return Ok(Action::await_change()); // already Released or Failed
    }
    let namespace = allocation.namespace().unwrap_or_default();
    let spec = &allocation.spec;
    let pod = caches
        .pod(&namespace, &spec.pod_name, &spec.pod_uid)
        .await?;
    if let Some(reason) = release_reason(&allocation, pod.as_ref()) {
        let api: Api<VgpuAllocation> = Api::namespaced(caches.client.clone(), &namespace);
        let status = json!({"status": {"phase": "Released", "releasedAt": Timestamp::now().to_string(), "message": reason}});
        match api
            .patch_status(
                &allocation.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(allocation = %allocation.name_any(), %namespace, %reason, "released")
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(Error::kube("marking the allocation Released")(e)),
        }
    } else if served_unrecorded(&allocation, pod.as_ref()) {
        // Guarded by the version read: a concurrent write by the agent wins.
        let api: Api<VgpuAllocation> = Api::namespaced(caches.client.clone(), &namespace);
        let status = json!({
            "metadata": {"resourceVersion": allocation.metadata.resource_version},
            "status": {"phase": "Allocated", "allocatedAt": Timestamp::now().to_string(),
                "message": "the pod's containers started before the node agent recorded its Allocate"},
        });
        match api
            .patch_status(
                &allocation.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(allocation = %allocation.name_any(), %namespace, "marked Allocated: the pod runs")
            }
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(Error::kube("marking the allocation Allocated")(e)),
        }
    }
    Ok(Action::await_change())
}

async fn locks(client: Client) {
    let (locks, lock_events) = cached(Api::<NodeLock>::all(client.clone()));
    let (pods, pod_events) = cached(Api::<Pod>::all(client.clone()));
    let (allocations, allocation_events) = cached(Api::<VgpuAllocation>::all(client.clone()));
    let caches = Arc::new(Caches {
        client,
        pods,
        allocations,
    });
    let by_holder = {
        let locks = locks.clone();
        move |pod: Pod| {
            let uid = pod.metadata.uid.unwrap_or_default();
            locks
                .state()
                .into_iter()
                .filter(|lock| lock.spec.holder.uid == uid)
                .map(|lock| ObjectRef::from_obj(&*lock))
                .collect::<Vec<_>>()
        }
    };
    Controller::for_stream(lock_events, locks)
        .watches_stream(pod_events, by_holder)
        .watches_stream(allocation_events, |a| {
            Some(ObjectRef::<NodeLock>::new(&a.spec.node_name))
        })
        .run(reconcile_lock, retry_cached, caches)
        .for_each(|_| async {})
        .await;
}

async fn reconcile_lock(lock: Arc<NodeLock>, caches: Arc<Caches>) -> Result<Action, Error> {
    let holder = &lock.spec.holder;
    let pod = caches
        .pod(&holder.namespace, &holder.name, &holder.uid)
        .await?;
    let allocation = caches
        .allocations
        .get(&ObjectRef::new(&lock.spec.allocation).within(&holder.namespace));
    match lock_action(&lock, pod.as_ref(), allocation.as_deref(), Timestamp::now()) {
        LockAction::Release(reason) => {
            let locks: Api<NodeLock> = Api::all(caches.client.clone());
            let only_this = DeleteParams::default().preconditions(Preconditions {
                uid: lock.metadata.uid.clone(),
                resource_version: None,
            });
            match locks.delete(&lock.name_any(), &only_this).await {
                Ok(_) => {
                    tracing::info!(node = %lock.name_any(), holder = %holder.name, %reason, "released NodeLock")
                }
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => return Err(Error::kube("releasing the NodeLock")(e)),
            }
            Ok(Action::await_change())
        }
        LockAction::KeepUntil(expiry) => {
            let wait = expiry.duration_since(Timestamp::now()).unsigned_abs();
            Ok(Action::requeue(wait + Duration::from_millis(100)))
        }
    }
}

async fn configs(client: Client) {
    let nodes = Api::<Node>::all(client.clone());
    let controller = Controller::new(
        Api::<GpuNodeConfig>::all(client.clone()),
        watcher::Config::default(),
    );
    let configs = controller.store();
    let (node_store, writer) = kube::runtime::reflector::store::<Node>();
    let node_events =
        kube::runtime::reflector(writer, watcher(nodes.clone(), watcher::Config::default()))
            .default_backoff();
    tokio::spawn(node_events.for_each(|_| async {}));
    let every_config = |store: Store<GpuNodeConfig>| {
        move || {
            store
                .state()
                .into_iter()
                .map(|c| ObjectRef::from_obj(&*c))
                .collect::<Vec<_>>()
        }
    };
    let (on_node, on_config) = (every_config(configs.clone()), every_config(configs.clone()));
    let context = Arc::new(ConfigContext {
        client: client.clone(),
        configs,
        nodes: node_store,
    });
    controller
        // Matches depend on every node, and conflicts on every other config:
        // any node or config change re-reconciles all configs (writes happen
        // only where a status changes, so this settles at once).
        .watches(nodes, watcher::Config::default(), move |_: Node| on_node())
        .watches(
            Api::<GpuNodeConfig>::all(client),
            watcher::Config::default(),
            move |_| on_config(),
        )
        .run(
            reconcile_config,
            |_, error, _| {
                tracing::warn!(%error, "GpuNodeConfig status failed; retrying");
                Action::requeue(RETRY)
            },
            context,
        )
        .for_each(|_| async {})
        .await;
}

struct ConfigContext {
    client: Client,
    configs: Store<GpuNodeConfig>,
    nodes: Store<Node>,
}

async fn reconcile_config(
    config: Arc<GpuNodeConfig>,
    ctx: Arc<ConfigContext>,
) -> Result<Action, Error> {
    // Matching against a half-filled node cache would publish wrong matches.
    if ctx.nodes.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(RETRY));
    }
    let name = config.name_any();
    let all: Vec<GpuNodeConfig> = ctx.configs.state().iter().map(|c| (**c).clone()).collect();
    let mut matched = Vec::new();
    let mut conflicts = Vec::new();
    for node in ctx.nodes.state() {
        let labels = node.labels().clone();
        let node_name = node.name_any();
        if !config.selects(&node_name, &labels) {
            continue;
        }
        matched.push(node_name.clone());
        let resolved = resolve(&node_name, &labels, &NodeSettings::default(), &all);
        conflicts.extend(
            resolved
                .conflicts
                .into_iter()
                .filter(|c| c.configs.contains(&name)),
        );
    }
    matched.sort();
    let status = GpuNodeConfigStatus {
        observed_generation: config.metadata.generation,
        matched_node_count: u32::try_from(matched.len()).unwrap_or(u32::MAX),
        matched_nodes: matched,
        conflicts,
        conditions: config
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
    };
    if config.status.as_ref() != Some(&status) {
        let api: Api<GpuNodeConfig> = Api::all(ctx.client.clone());
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .map_err(Error::kube("writing GpuNodeConfig status"))?;
    }
    Ok(Action::await_change())
}
