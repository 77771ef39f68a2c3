//! How Bind confirms a placement once the pod's allocation is written,
//! against a real API server: from this replica's own watch, which has
//! delivered every allocation of the node once it delivers the one just
//! created (no list, no status write); from a list when the watch lags; and
//! never over the node's capacity when another replica filled the node.

use tessera_testkit::cluster as support;

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt, api::PostParams, client::ClientBuilder, runtime::watcher::Event,
};
use serde_json::json;
use support::Cluster;
use tessera_api::{
    testing,
    v1alpha1::{AllocationPhase, GpuNode, NodeLock, VgpuAllocation},
};
use tessera_controllers::{
    Error,
    config::Config,
    extender::{Binder, wire::ExtenderBindingArgs},
    metrics::Metrics,
    projection::{AllocationRelist, Projection},
};
use tessera_e2e::ControlPlane;

const NODE: &str = "confirm-1";

/// Requests the binder sent, by kind.
#[derive(Default)]
struct Sent {
    allocation_lists: AtomicUsize,
    allocation_status_writes: AtomicUsize,
    gpu_node_reads: AtomicUsize,
}

async fn counting_client(plane: &ControlPlane, sent: Arc<Sent>) -> Client {
    let config = plane.client_config().await.unwrap();
    let layer =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            let path = request.uri().path();
            let method = request.method();
            if method == http::Method::GET && path.ends_with("/vgpuallocations") {
                sent.allocation_lists.fetch_add(1, Ordering::SeqCst);
            }
            if path.contains("/vgpuallocations/") && path.ends_with("/status") {
                sent.allocation_status_writes.fetch_add(1, Ordering::SeqCst);
            }
            if method == http::Method::GET && path.contains("/gpunodes/") {
                sent.gpu_node_reads.fetch_add(1, Ordering::SeqCst);
            }
            request
        });
    ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build()
}

/// A cluster with one node of two 80 GB GPUs, and a binder counting its
/// requests, on `projection` (the cluster's own when `None`).
async fn setup(projection: Option<Projection>) -> (Cluster, Binder, Arc<Sent>, Arc<Metrics>) {
    let config = Config::default();
    let cluster = Cluster::start(config.clone()).await;
    cluster
        .add_gpu_node(NODE, "NVIDIA A100-SXM4-80GB", 2, 81920)
        .await;
    let sent = Arc::new(Sent::default());
    let projection = projection.unwrap_or_else(|| cluster.projection.clone());
    let metrics = Metrics::new(projection.clone(), Default::default());
    let binder = Binder::new(
        counting_client(&cluster.plane, sent.clone()).await,
        projection,
        Arc::new(config),
        metrics.extender.clone(),
    );
    (cluster, binder, sent, metrics)
}

/// A pod asking for one whole GPU's memory, which the real kube-scheduler
/// leaves Pending (its node selector matches nothing).
async fn whole_gpu_pod(cluster: &Cluster, name: &str) -> ExtenderBindingArgs {
    cluster.pod_bound_by_hand(name, 81920, NODE).await
}

/// Fills both GPUs of the node with the allocations of two pods bound
/// there, as another replica's Binds would have (`tag` names them apart).
async fn fill_the_node(cluster: &Cluster, tag: &str) {
    let allocations: Api<VgpuAllocation> = Api::namespaced(cluster.client.clone(), "default");
    for gpu in 0..2 {
        let name = format!("other-{tag}-{gpu}");
        // Bound to the node (no kubelet runs it): the lifecycle controllers
        // keep its allocation.
        let pod = cluster
            .create_raw_pod(json!({
                "metadata": {"name": name},
                "spec": {"nodeName": NODE,
                    "containers": [{"name": "main", "image": "example.invalid/cuda"}]},
            }))
            .await
            .unwrap();
        let allocation = testing::allocation(&name, &pod.uid().unwrap(), NODE)
            .container(testing::container(
                "main",
                vec![testing::slice(&format!("GPU-{NODE}-{gpu}"), gpu, 81920, 0)],
            ))
            .build();
        allocations
            .create(&PostParams::default(), &allocation)
            .await
            .unwrap();
    }
}

/// The pod is unbound, holds no allocation, and the node's lock is gone.
async fn nothing_left(cluster: &Cluster, args: &ExtenderBindingArgs) {
    let pod = Api::<Pod>::namespaced(cluster.client.clone(), "default")
        .get(&args.pod_name)
        .await
        .unwrap();
    assert_eq!(pod.spec.and_then(|s| s.node_name), None);
    let allocation = Api::<VgpuAllocation>::namespaced(cluster.client.clone(), "default")
        .get_opt(&args.pod_name)
        .await
        .unwrap();
    assert!(allocation.is_none(), "{allocation:?}");
    let lock = Api::<NodeLock>::all(cluster.client.clone())
        .get_opt(NODE)
        .await
        .unwrap();
    assert!(lock.is_none(), "{lock:?}");
}

#[tokio::test]
async fn a_bind_confirms_from_its_own_watch_and_writes_no_status() {
    let (cluster, binder, sent, metrics) = setup(None).await;
    let args = whole_gpu_pod(&cluster, "fits").await;
    binder.bind(&args, None).await.unwrap();

    assert_eq!(sent.allocation_lists.load(Ordering::SeqCst), 0);
    assert_eq!(sent.allocation_status_writes.load(Ordering::SeqCst), 0);
    // No GpuNode read: a stopping agent closes its node by taking the
    // node's lock itself (see `agent_ready`).
    assert_eq!(sent.gpu_node_reads.load(Ordering::SeqCst), 0);
    assert!(
        !metrics
            .render()
            .contains("tessera_bind_rechecks_listed_total 1"),
        "the watch was behind"
    );
    // The CRD's default status says Bound, in every read.
    let allocation = cluster.allocation("fits").await;
    assert_eq!(
        allocation.status.and_then(|s| s.phase),
        Some(AllocationPhase::Bound)
    );
    let pod = Api::<Pod>::namespaced(cluster.client.clone(), "default")
        .get("fits")
        .await
        .unwrap();
    assert_eq!(pod.spec.and_then(|s| s.node_name).as_deref(), Some(NODE));
}

#[tokio::test]
async fn allocations_this_replica_never_saw_are_found_by_a_list() {
    // A ledger fed by hand with the node only: it never sees the allocations
    // another replica wrote, nor this Bind's own, so its watch never catches
    // up and Bind asks the API server.
    let (projection, feeder) = Projection::new();
    let (cluster, binder, sent, metrics) = setup(Some(projection.clone())).await;
    feed_the_node(&cluster, &feeder).await;
    let mut relist = AllocationRelist::default();
    feeder.allocation_event(Event::Init, &mut relist);
    feeder.allocation_event(Event::InitDone, &mut relist);

    fill_the_node(&cluster, "a").await;
    let args = whole_gpu_pod(&cluster, "late").await;
    let error = binder.bind(&args, None).await.unwrap_err();
    assert!(
        matches!(&error, Error::NoLongerFits { reason, .. } if reason.contains("leave no room")),
        "{error}"
    );
    assert_eq!(sent.allocation_lists.load(Ordering::SeqCst), 1);
    assert!(
        metrics
            .render()
            .contains("tessera_bind_rechecks_listed_total 1"),
        "{}",
        metrics.render()
    );
    nothing_left(&cluster, &args).await;
    // The ledger forgot the reservation.
    assert!(projection.read().allocation_count() == 0);
}

/// Feeds the node's GpuNode, as the API server has it, to a hand-fed ledger.
async fn feed_the_node(cluster: &Cluster, feeder: &tessera_controllers::projection::Feeder) {
    let gpu_node = Api::<GpuNode>::all(cluster.client.clone())
        .get(NODE)
        .await
        .unwrap();
    let mut nodes = Vec::new();
    feeder.node_event(Event::Init, &mut nodes);
    feeder.node_event(Event::InitApply(gpu_node), &mut nodes);
    feeder.node_event(Event::InitDone, &mut nodes);
}

/// A projection fed by hand: the node now, and VgpuAllocation events from a
/// real watch, but none of them until the watch delivers the allocation of
/// `held_until` (then all, in order).
async fn late_ledger(cluster: &Cluster, held_until: &'static str) -> Projection {
    use futures::StreamExt;
    let (projection, feeder) = Projection::new();
    feed_the_node(cluster, &feeder).await;
    let events = kube::runtime::watcher(
        Api::<VgpuAllocation>::all(cluster.client.clone()),
        kube::runtime::watcher::Config::default(),
    );
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut relist = AllocationRelist::default();
        let mut held = Vec::new();
        let mut released = false;
        while let Some(Ok(event)) = events.next().await {
            let ours = matches!(&event, Event::Apply(a) if a.name_any() == held_until);
            let initial = matches!(&event, Event::Init | Event::InitApply(_) | Event::InitDone);
            held.push(event);
            if ours || initial || released {
                released |= ours;
                for event in held.drain(..) {
                    feeder.allocation_event(event, &mut relist);
                }
            }
        }
    });
    projection
}

#[tokio::test]
async fn allocations_the_watch_delivers_after_reserving_are_counted() {
    let cluster = Cluster::start(Config::default()).await;
    cluster
        .add_gpu_node(NODE, "NVIDIA A100-SXM4-80GB", 2, 81920)
        .await;
    let projection = late_ledger(&cluster, "behind").await;
    let sent = Arc::new(Sent::default());
    let metrics = Metrics::new(projection.clone(), Default::default());
    let binder = Binder::new(
        counting_client(&cluster.plane, sent.clone()).await,
        projection.clone(),
        Arc::new(Config::default()),
        metrics.extender.clone(),
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    fill_the_node(&cluster, "c").await;
    let args = whole_gpu_pod(&cluster, "behind").await;
    // The ledger has not seen the node filled: Bind reserves, writes its
    // allocation, and its confirmation waits for the watch to deliver it,
    // and so everything written before it.
    assert!(projection.read().allocation_count() == 0);
    let error = binder.bind(&args, None).await.unwrap_err();
    assert!(
        matches!(&error, Error::NoLongerFits { reason, .. } if reason.contains("leave no room")),
        "{error}"
    );
    assert_eq!(sent.allocation_lists.load(Ordering::SeqCst), 0);
    nothing_left(&cluster, &args).await;
}

#[tokio::test]
async fn a_node_another_replica_just_filled_is_never_overcommitted() {
    let (cluster, binder, _, _) = setup(None).await;
    // Written, then bound at once: this replica's watch may deliver the
    // other allocations before Bind reserves (Bind refuses at once) or only
    // after (Bind's confirmation refuses). Either way the pod stays unbound.
    for round in 0..5 {
        let name = format!("racer-{round}");
        let args = whole_gpu_pod(&cluster, &name).await;
        if round == 0 {
            fill_the_node(&cluster, "b").await;
        }
        let error = binder.bind(&args, None).await.unwrap_err();
        assert!(matches!(error, Error::NoLongerFits { .. }), "{error}");
        nothing_left(&cluster, &args).await;
    }
}
