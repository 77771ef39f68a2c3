//! A real control plane + kube-scheduler calling Tessera's extender in-process.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use tessera_api::{
    testing,
    v1alpha1::{GpuDevice, GpuNode, GpuNodeSpec, NodeLock, VgpuAllocation},
};
use tessera_controllers::{
    app::{serve_extender, serve_webhook},
    cache::Cache,
    config::Config,
    metrics::Metrics,
    projection::{Projection, Watches},
    webhook::{Webhook, certificate::CertificateFiles},
};
use tessera_e2e::ControlPlane;

/// How long the helpers wait for the cluster to react.
pub const WAIT: Duration = Duration::from_secs(60);

/// A control plane whose kube-scheduler calls an extender, webhook and
/// projection running in the test process.
pub struct Cluster {
    /// The in-process extender's loopback port (also its `/metrics`).
    pub extender_port: u16,
    /// kube-apiserver, etcd and kube-scheduler.
    pub plane: ControlPlane,
    /// An admin client.
    pub client: Client,
    /// The ledger the extender decides with.
    pub projection: Projection,
}

/// kube-scheduler with only the extender scoring for `tessera-scheduler`
/// (the default score plugins are off so placements are deterministic),
/// binding through the extender.
fn scheduler_config(port: u16, config: &Config) -> String {
    tessera_e2e::stack::scheduler_config_for(port, &config.request.resource_names())
}

impl Cluster {
    /// Starts it with `config` and an admin client.
    pub async fn start(config: Config) -> Self {
        Self::start_with(config, async |plane: &ControlPlane| {
            plane.client().await.unwrap()
        })
        .await
    }

    /// Like `start`, with the extender writing through the client `extender_client` makes.
    pub async fn start_with(
        config: Config,
        extender_client: impl AsyncFnOnce(&ControlPlane) -> Client,
    ) -> Self {
        Self::start_watching(config, Watches::default(), extender_client).await
    }

    /// Like `start_with`, the projection also watching what `watches` names.
    pub async fn start_watching(
        config: Config,
        watches: Watches,
        extender_client: impl AsyncFnOnce(&ControlPlane) -> Client,
    ) -> Self {
        let plane = ControlPlane::start().await.expect("control plane");
        let client = plane.client().await.unwrap();
        let extender = extender_client(&plane).await;
        let cache = Cache::spawn(client.clone(), &watches);
        let projection = Projection::spawn_on(&cache);
        if let Some(freed) = projection.take_freed_nodes() {
            tokio::spawn(tessera_controllers::extender::nudge_nodes(
                client.clone(),
                freed,
            ));
        }
        let config = Arc::new(config);
        let request = config.request.clone();
        tokio::spawn(async move { tessera_controllers::lifecycle::run(cache, &request).await });
        let metrics = Metrics::new(projection.clone(), config.request.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(serve_extender(
            listener,
            extender,
            projection.clone(),
            config.clone(),
            metrics.clone(),
        ));
        plane
            .start_scheduler(&scheduler_config(port, &config))
            .await
            .expect("kube-scheduler");

        let webhook = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let webhook_port = webhook.local_addr().unwrap().port();
        let pki = plane.pki();
        let files = CertificateFiles::new(&pki.serving_cert, &pki.serving_key);
        let handler = Webhook::new(config, projection.clone(), metrics.webhook.clone());
        tokio::spawn(async move {
            if let Err(error) = serve_webhook(webhook, files, handler).await {
                panic!("webhook stopped: {error:#}");
            }
        });
        let cluster = Self {
            extender_port: port,
            plane,
            client,
            projection,
        };
        cluster.register_webhook(webhook_port).await;
        cluster
    }

    /// Registers the webhook the way docs/configuration.md recommends:
    /// failurePolicy Fail, and matchConditions so only GPU pods are sent.
    async fn register_webhook(&self, port: u16) {
        let ca = std::fs::read(&self.plane.pki().ca_cert).unwrap();
        let config = tessera_e2e::stack::webhook_configuration(
            &format!("https://127.0.0.1:{port}/mutate"),
            &ca,
        );
        let api: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
            Api::all(self.client.clone());
        api.create(
            &PostParams::default(),
            &serde_json::from_value(config).unwrap(),
        )
        .await
        .unwrap();
    }

    /// The extender's `/metrics` text (webhook counters included).
    pub async fn metrics(&self) -> String {
        scrape(self.extender_port).await
    }

    /// Creates a pod exactly as given (no schedulerName added).
    pub async fn create_raw_pod(&self, pod: Value) -> Result<Pod, kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
    }

    /// A pod of one GPU with `mib` MiB in `default`, which the real
    /// kube-scheduler leaves Pending (its node selector matches no node),
    /// for a test that drives the Binder itself: its binding arguments for
    /// `node`.
    pub async fn pod_bound_by_hand(
        &self,
        name: &str,
        mib: u64,
        node: &str,
    ) -> tessera_controllers::extender::wire::ExtenderBindingArgs {
        let pod = self
            .create_raw_pod(json!({
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": "tessera-scheduler",
                    "nodeSelector": {"tessera.dev/test": "bound-by-hand"},
                    "containers": [{"name": "main", "image": "example.invalid/cuda",
                        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string()}}}],
                },
            }))
            .await
            .unwrap();
        tessera_controllers::extender::wire::ExtenderBindingArgs {
            pod_name: name.into(),
            pod_namespace: "default".into(),
            pod_uid: pod.uid().unwrap(),
            node: node.into(),
        }
    }

    /// A Ready node with the hostname label and `labels`.
    pub async fn add_node(&self, name: &str, labels: Value) {
        create_node(&self.client, name, labels).await;
    }

    /// A Ready node and its GpuNode with `gpus` devices of `model` and `mib` MiB.
    pub async fn add_gpu_node(&self, name: &str, model: &str, gpus: u32, mib: u64) {
        self.add_node(name, json!({})).await;
        let gpu_nodes: Api<GpuNode> = Api::all(self.client.clone());
        gpu_nodes
            .create(&PostParams::default(), &GpuNode::new(name, GpuNodeSpec {}))
            .await
            .unwrap();
        let devices = (0..gpus)
            .map(|i| GpuDevice {
                uuid: format!("GPU-{name}-{i}"),
                numa_node: Some(i / 2),
                ..testing::gpu(i, model, mib)
            })
            .collect();
        let mut status = testing::gpu_node_status(devices);
        // As the GpuNodes these tests have always written: no conditions
        // (the projection counts a GpuNode without them as ready).
        status.conditions.clear();
        let status = json!({ "status": status });
        gpu_nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        while self
            .projection
            .read()
            .node(name)
            .is_none_or(|n| n.devices.len() != gpus as usize)
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "projection never saw {name}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Creates pod `name` in `default` for `tessera-scheduler`, one
    /// container with `limits` and the pod `annotations`.
    pub async fn create_pod(&self, name: &str, limits: Value, annotations: Value) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "schedulerName": "tessera-scheduler",
                "containers": [{"name": "main", "image": "example.invalid/cuda", "resources": {"limits": limits}}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }

    /// The node the pod is bound to, waiting for it.
    pub async fn node_of(&self, name: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let pod = pods.get(name).await.unwrap();
            if let Some(node) = pod.spec.and_then(|s| s.node_name) {
                return node;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {name} was never bound"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until pod `name` is bound and served: its allocation is
    /// `Allocated` and the extender's projection shows no NodeLock held, so no
    /// node is in a bind-to-Allocate window. Prioritize scores a node in that
    /// window lowest (`engine::prioritized_score`), so a test that means
    /// "pods arrive one after another" waits here between them.
    pub async fn served(&self, name: &str) {
        self.node_of(name).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let allocated = self
                .allocation(name)
                .await
                .status
                .and_then(|s| s.phase)
                .is_some_and(|p| p == tessera_api::v1alpha1::AllocationPhase::Allocated);
            if allocated
                && self
                    .metrics()
                    .await
                    .lines()
                    .any(|l| l == "tessera_node_locks 0")
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {name} was never served (allocation Allocated, no NodeLock held)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The VgpuAllocation of pod `name` in `default`.
    pub async fn allocation(&self, name: &str) -> VgpuAllocation {
        Api::<VgpuAllocation>::namespaced(self.client.clone(), "default")
            .get(name)
            .await
            .unwrap()
    }

    /// The FailedScheduling messages of a pod, waiting for at least one.
    pub async fn failed_scheduling(&self, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await
                .unwrap();
            let messages: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
                .filter_map(|e| e.message)
                .collect();
            if !messages.is_empty() {
                return messages;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no FailedScheduling event for {name}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Creates a Ready Node `name` with the hostname label and `labels`, as a
/// kubelet would register it.
pub async fn create_node(client: &Client, name: &str, labels: Value) {
    let mut all_labels = json!({"kubernetes.io/hostname": name});
    if let (Some(all), Some(extra)) = (all_labels.as_object_mut(), labels.as_object()) {
        all.extend(extra.clone());
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": all_labels},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}],
        },
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

/// A component's `/metrics` text on a loopback port, asserting a 200.
pub async fn scrape(port: u16) -> String {
    tessera_e2e::http::get_body(&format!("127.0.0.1:{port}"), "/metrics")
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

/// Stands in for the node agent's Allocate step until the node agent exists.
/// Like a kubelet, it acts only once the pod is bound to the node: then, for
/// the pod a NodeLock names, it marks the allocation Allocated, which
/// releases the lock, as the agent does after serving the kubelet. Each node is served on
/// its own, concurrently with the others.
pub fn spawn_allocate_stand_in(client: Client) {
    // Which node each pod (by UID) is bound to, from a watch of all pods.
    let (bound_tx, bound) = tokio::sync::watch::channel(std::collections::HashMap::new());
    let pods: Api<Pod> = Api::all(client.clone());
    tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(pod)) = events.next().await {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let (Some(uid), Some(node)) = (pod.metadata.uid.clone(), node) {
                bound_tx.send_modify(|bound| {
                    bound.insert(uid, node);
                });
            }
        }
    });
    // The allocations, from a watch as the agent will have them.
    let (allocation_store, writer) = kube::runtime::reflector::store::<VgpuAllocation>();
    let all_allocations: Api<VgpuAllocation> = Api::all(client.clone());
    // With a backoff: without one a failing watch (the control plane gone
    // at the end of a test) is retried in a loop that never yields, and the
    // runtime's shutdown waits on that worker forever (it hung CI).
    tokio::spawn(
        kube::runtime::reflector(
            writer,
            watcher(all_allocations, watcher::Config::default()).default_backoff(),
        )
        .for_each(|_| async {}),
    );
    tokio::spawn(async move {
        let locks: Api<NodeLock> = Api::all(client.clone());
        let mut events = watcher(locks.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(lock)) = events.next().await {
            let (client, mut bound) = (client.clone(), bound.clone());
            let allocation_store = allocation_store.clone();
            tokio::spawn(async move {
                let node = lock.name_any();
                let holder = lock.spec.holder.uid.clone();
                let served = tokio::time::timeout(WAIT, async {
                    bound
                        .wait_for(|b| b.get(&holder) == Some(&node))
                        .await
                        .is_ok()
                })
                .await;
                if served != Ok(true) {
                    return; // never bound here: the lifecycle controller releases the lock
                }
                let allocations: Api<VgpuAllocation> =
                    Api::namespaced(client.clone(), &lock.spec.holder.namespace);
                // Bind creates the allocation before binding the pod.
                let key = kube::runtime::reflector::ObjectRef::new(&lock.spec.allocation)
                    .within(&lock.spec.holder.namespace);
                let mut allocation = allocation_store.get(&key);
                for _ in 0..1000 {
                    if allocation
                        .as_ref()
                        .is_some_and(|a| a.spec.pod_uid == holder)
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    allocation = allocation_store.get(&key);
                }
                let Some(allocation) = allocation.filter(|a| a.spec.pod_uid == holder) else {
                    return;
                };
                let served: Vec<&String> =
                    allocation.spec.containers.iter().map(|c| &c.name).collect();
                let allocated =
                    json!({"status": {"phase": "Allocated", "servedContainers": served}});
                // Which releases the lock.
                let _ = allocations
                    .patch_status(
                        &allocation.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(allocated),
                    )
                    .await;
            });
        }
    });
}
