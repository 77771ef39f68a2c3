//! How many LIST and WATCH requests the controller makes at start, counted
//! at its client: the leader lists and watches each kind once, whoever
//! reads it (projection, extender, lifecycle controllers). A watch that
//! fails and is retried (kube's watcher lists again after an error, which a
//! loaded API server gives now and then right after a CRD is established)
//! is the same subscription: the retries the watches log are counted and
//! allowed for, kind by kind, and nothing else.

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

/// Watch failures logged ("watch failed; retrying"), by kind.
type Retries = Arc<Mutex<BTreeMap<String, u32>>>;

/// Counts the warnings `tessera_kubekit`'s watches log when they retry.
struct RetryCounter(Retries);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RetryCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            message: String,
            kind: String,
        }
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                match field.name() {
                    "message" => self.message = format!("{value:?}"),
                    "kind" => self.kind = format!("{value:?}"),
                    _ => {}
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message.contains("watch failed; retrying") {
            let mut retries = self.0.lock().unwrap_or_else(|e| e.into_inner());
            *retries.entry(fields.kind).or_default() += 1;
        }
    }
}

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
    use tracing_subscriber::layer::SubscriberExt;
    let retries = Retries::default();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(RetryCounter(retries.clone())),
    );
    // The counter reads the watches' log line as they write it.
    tracing::warn!(kind = %"SelfCheck", "watch failed; retrying");
    assert_eq!(
        retries.lock().unwrap().remove("SelfCheck"),
        Some(1),
        "the retry counter does not see the watches' warnings"
    );
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
    let (projection, _election) = start_loops(
        client.clone(),
        &watches,
        election,
        lease,
        Default::default(),
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
    let retries = retries.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!("watch retries by kind: {retries:?}");
    let expected = [
        ("/api/v1/namespaces/default/pods", "Pod"),
        ("/api/v1/nodes", "Node"),
        ("/api/v1/pods", "Pod"),
        ("/api/v1/resourcequotas", "ResourceQuota"),
        (
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            "Lease",
        ),
        ("/apis/tessera.dev/v1alpha1/gpunodeconfigs", "GpuNodeConfig"),
        ("/apis/tessera.dev/v1alpha1/gpunodes", "GpuNode"),
        ("/apis/tessera.dev/v1alpha1/nodelocks", "NodeLock"),
        (
            "/apis/tessera.dev/v1alpha1/vgpuallocations",
            "VgpuAllocation",
        ),
    ];
    // Pods are watched at two paths; a retried Pod watch is allowed at
    // either but not both.
    let pod_retries = retries.get("Pod").copied().unwrap_or(0);
    let mut pod_extra = 0;
    for (path, kind) in expected {
        let got = counts.get(path).copied().unwrap_or_default();
        let extra = got[0].saturating_sub(1);
        let allowed = if kind == "Pod" {
            pod_extra += extra;
            pod_retries
        } else {
            retries.get(kind).copied().unwrap_or(0)
        };
        assert!(
            got[0] == got[1] && got[0] >= 1 && extra <= allowed,
            "{path}: {got:?} with {allowed} logged retries of {kind}: {counts:?}"
        );
    }
    assert!(pod_extra <= pod_retries, "{counts:?}, {retries:?}");
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        expected.iter().map(|(path, _)| path).collect::<Vec<_>>(),
        "watched kinds"
    );
}
