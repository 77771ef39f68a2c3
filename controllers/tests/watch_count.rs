//! How many LIST and WATCH requests the controller makes at start, counted
//! at its client: the leader lists and watches each kind once, whoever
//! reads it (projection, extender, lifecycle controllers).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::{Client, client::ClientBuilder};
use tessera_controllers::{app::start_loops, cache::Watches, leader::Election};
use tessera_e2e::ControlPlane;

/// LIST and WATCH requests by path.
type Counts = Arc<Mutex<BTreeMap<String, [u32; 2]>>>;

/// A client that counts its LIST ([0]) and WATCH ([1]) requests.
async fn counting_client(plane: &ControlPlane) -> (Client, Counts) {
    let counts = Counts::default();
    let seen = counts.clone();
    let count = move |request: http::Request<kube::client::Body>| {
        let uri = request.uri();
        let query = uri.query().unwrap_or_default();
        let watch = query.split('&').any(|p| p == "watch=true");
        // A watcher's list pages (`limit=`); single GETs have no query.
        if request.method() == http::Method::GET && (watch || query.contains("limit=")) {
            let mut counts = seen.lock().unwrap_or_else(|e| e.into_inner());
            counts.entry(uri.path().to_owned()).or_default()[usize::from(watch)] += 1;
        }
        request
    };
    let config = plane.client_config().await.unwrap();
    let client = ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&tower::util::MapRequestLayer::new(count))
        .build();
    (client, counts)
}

/// Issue 13: the leader used to list and watch VgpuAllocations three
/// times, NodeLocks, Pods, Nodes, GpuNodeConfigs and the agents' Leases
/// twice each (15 LIST + 15 WATCH with the chart's flags).
#[tokio::test]
async fn the_leader_lists_and_watches_each_kind_once() {
    let plane = ControlPlane::start().await.unwrap();
    let (client, counts) = counting_client(&plane).await;
    let watches = Watches {
        agent_leases: Some("kube-node-lease".to_owned()),
        agent_pods: Some(("default".to_owned(), "app=agent".to_owned())),
    };
    let election = Election {
        namespace: "default".into(),
        name: "tessera-controller".into(),
        identity: "replica-a".into(),
        lease_duration: Duration::from_secs(15),
    };
    let lease = Some("kube-node-lease".to_owned());
    let projection = start_loops(
        client.clone(),
        &watches,
        election,
        lease,
        Default::default(),
    );
    projection.wait_synced().await;
    // Leadership, then every lifecycle watch's list and first watch.
    let started = tokio::time::Instant::now();
    loop {
        let counts = counts.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if counts.contains_key("/api/v1/nodes") && counts.values().all(|[l, w]| l == w) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counts = counts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (path, [list, watch]) in &counts {
        println!("{path}: {list} LIST, {watch} WATCH");
    }
    let expected = [
        "/api/v1/namespaces/default/pods",
        "/api/v1/nodes",
        "/api/v1/pods",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        "/apis/tessera.dev/v1alpha1/gpunodeconfigs",
        "/apis/tessera.dev/v1alpha1/gpunodes",
        "/apis/tessera.dev/v1alpha1/nodelocks",
        "/apis/tessera.dev/v1alpha1/vgpuallocations",
    ];
    assert_eq!(
        counts,
        expected
            .iter()
            .map(|path| ((*path).to_owned(), [1, 1]))
            .collect::<BTreeMap<_, _>>()
    );
}
