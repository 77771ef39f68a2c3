//! What no tenant annotation and no lost answer may do to a node's lock,
//! against a real API server with Tessera's lifecycle controllers running
//! (review 2026-12-01): a pod carrying `hami.io/bind-phase: success` keeps
//! its NodeLock until it is served (H1), and a binding whose answer is lost
//! after the API server committed it is never rolled back (H6). The pods'
//! node selector matches no node, so the real kube-scheduler leaves them to
//! the Binder these tests drive; no kubelet serves them, so a lock stays held
//! until the test ends.

use tessera_testkit::cluster as support;

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    client::ClientBuilder,
};
use serde_json::json;
use support::Cluster;
use tessera_api::v1alpha1::{NodeLock, VgpuAllocation};
use tessera_controllers::{
    Error,
    config::Config,
    extender::{Binder, wire::ExtenderBindingArgs},
    metrics::Metrics,
};
use tessera_e2e::ControlPlane;

const NODE: &str = "safe-1";

/// What the fault layer does to the next binding POSTs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Sends each to the API server, then drops its answer (a client
    /// timeout, or a connection lost, after the server committed it).
    DropAnswer,
    /// Fails each before it is sent (the server never sees it).
    DropRequest,
}

/// Injects `fault` into the next `left` binding POSTs.
#[derive(Clone)]
struct Faults {
    fault: Fault,
    left: Arc<AtomicUsize>,
}

impl Faults {
    fn new(fault: Fault, left: usize) -> Self {
        Self {
            fault,
            left: Arc::new(AtomicUsize::new(left)),
        }
    }

    fn take(&self, request: &http::Request<kube::client::Body>) -> Option<Fault> {
        let binding =
            request.method() == http::Method::POST && request.uri().path().ends_with("/binding");
        let taken = binding
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        taken.then_some(self.fault)
    }
}

impl<S> tower::Layer<S> for Faults {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FaultService {
            inner,
            faults: self.clone(),
        }
    }
}

#[derive(Clone)]
struct FaultService<S> {
    inner: S,
    faults: Faults,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> tower::Service<http::Request<kube::client::Body>> for FaultService<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let fault = self.faults.take(&request);
        if fault == Some(Fault::DropRequest) {
            return Box::pin(async {
                Err("injected: the connection broke before the binding was sent".into())
            });
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await.map_err(Into::into)?;
            if fault == Some(Fault::DropAnswer) {
                return Err("injected: the binding's answer was lost after it was sent".into());
            }
            Ok(answer)
        })
    }
}

/// A cluster with one 2-GPU node and a Binder writing through `faults`.
async fn setup(faults: Faults) -> (Cluster, Binder) {
    setup_with(faults, Config::default().node_lock_ttl_seconds).await
}

/// [`setup`], NodeLocks lasting `ttl_seconds`.
async fn setup_with(faults: Faults, ttl_seconds: u32) -> (Cluster, Binder) {
    let config = Config {
        node_lock_wait_millis: 3_000,
        node_lock_ttl_seconds: ttl_seconds,
        ..Config::default()
    };
    let cluster = Cluster::start(config.clone()).await;
    cluster
        .add_gpu_node(NODE, "NVIDIA A100-SXM4-80GB", 2, 81920)
        .await;
    let binder = Binder::new(
        faulty_client(&cluster.plane, faults).await,
        cluster.projection.clone(),
        Arc::new(config),
        Metrics::new(cluster.projection.clone(), Default::default())
            .extender
            .clone(),
    );
    (cluster, binder)
}

async fn faulty_client(plane: &ControlPlane, faults: Faults) -> Client {
    let config = plane.client_config().await.unwrap();
    ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&faults)
        .build()
}

/// A GPU pod of `mib` MiB the scheduler cannot place; its binding arguments.
async fn pod(cluster: &Cluster, name: &str, mib: u64) -> ExtenderBindingArgs {
    cluster.pod_bound_by_hand(name, mib, NODE).await
}

async fn lock_holder(cluster: &Cluster) -> Option<String> {
    Api::<NodeLock>::all(cluster.client.clone())
        .get_opt(NODE)
        .await
        .unwrap()
        .map(|l| l.spec.holder.name)
}

async fn allocation_of(cluster: &Cluster, name: &str) -> Option<VgpuAllocation> {
    Api::<VgpuAllocation>::namespaced(cluster.client.clone(), "default")
        .get_opt(name)
        .await
        .unwrap()
}

async fn node_of(cluster: &Cluster, name: &str) -> Option<String> {
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cluster.client.clone(), "default")
        .get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
}

/// H1: the webhook refuses a GPU pod created with the annotation, and a pod
/// that carries it all the same (here: written by an administrator after
/// creation, past the webhook) keeps its node's lock until it is served:
/// before the fix, the lifecycle controller and a waiting Bind's holder
/// check took `success` for "served by a vendor plugin" and freed the lock
/// before Allocate, and the next pod's lock was then served to it.
#[tokio::test]
async fn a_pod_saying_bind_phase_success_keeps_its_lock_until_served() {
    let (cluster, binder) = setup(Faults::new(Fault::DropAnswer, 0)).await;
    let refused = cluster
        .create_raw_pod(json!({
            "metadata": {"name": "claims-served", "annotations": {"hami.io/bind-phase": "success"}},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/cuda",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}]},
        }))
        .await
        .expect_err("the webhook refuses a GPU pod created with hami.io/bind-phase");
    assert!(
        refused
            .to_string()
            .contains("metadata.annotations[\"hami.io/bind-phase\"]"),
        "{refused}"
    );

    // M3: nor a GPU pod whose own mount would hide the agent's limits
    // directory (and with it the defence against `envFrom` limits).
    let shadowing = cluster
        .create_raw_pod(json!({
            "metadata": {"name": "shadows-limits"},
            "spec": {"volumes": [{"name": "mine", "emptyDir": {}}],
                "containers": [{"name": "main", "image": "example.invalid/cuda",
                "volumeMounts": [{"name": "mine", "mountPath": "/var/run/tessera/limits"}],
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}}}]},
        }))
        .await
        .expect_err("the webhook refuses a mount over the limits directory");
    assert!(
        shadowing
            .to_string()
            .contains("volumeMounts[0] (\"mine\") mountPath \"/var/run/tessera/limits\""),
        "{shadowing}"
    );

    let first = pod(&cluster, "first", 1000).await;
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cluster.client.clone(), "default")
        .patch(
            "first",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"hami.io/bind-phase": "success"}}})),
        )
        .await
        .unwrap();
    binder.bind(&first, None).await.expect("first binds");
    assert_eq!(node_of(&cluster, "first").await.as_deref(), Some(NODE));
    // The lifecycle controller has seen the lock, the allocation and the
    // bound pod well within this; a waiting Bind checks the holder every 2 s.
    let second = pod(&cluster, "second", 30000).await;
    let waited = binder.bind(&second, None).await;
    assert!(
        matches!(waited, Err(Error::LockBusy { .. })),
        "the second pod must wait for the first's Allocate, got {waited:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(lock_holder(&cluster).await.as_deref(), Some("first"));
    assert_eq!(node_of(&cluster, "second").await, None);
}

/// H6: the binding is committed but its answer is lost. Bind reads the pod
/// back, finds it bound and keeps its allocation and lock (before the fix it
/// deleted both, and the next pod's lock then served this pod).
#[tokio::test]
async fn a_binding_whose_answer_is_lost_is_kept_when_the_pod_is_bound() {
    let (cluster, binder) = setup(Faults::new(Fault::DropAnswer, 1)).await;
    let first = pod(&cluster, "first", 1000).await;
    binder
        .bind(&first, None)
        .await
        .expect("the pod is bound although the binding's answer was lost");
    assert_eq!(node_of(&cluster, "first").await.as_deref(), Some(NODE));
    let allocation = allocation_of(&cluster, "first")
        .await
        .expect("allocation kept");
    assert_eq!(allocation.spec.pod_uid, first.pod_uid);
    assert_eq!(lock_holder(&cluster).await.as_deref(), Some("first"));
    let second = pod(&cluster, "second", 1000).await;
    assert!(matches!(
        binder.bind(&second, None).await,
        Err(Error::LockBusy { .. })
    ));
}

/// H6: no binding reaches the API server and nothing says so for certain.
/// Bind keeps the allocation and the lock (the pod might be bound) and says
/// the outcome is unknown; kube-scheduler's retry then binds the pod on the
/// same node, reusing or replacing what the first try left.
#[tokio::test]
async fn a_binding_with_no_known_outcome_keeps_everything_and_a_retry_binds() {
    let (cluster, binder) = setup(Faults::new(Fault::DropRequest, 3)).await;
    let first = pod(&cluster, "first", 1000).await;
    let unknown = binder.bind(&first, None).await;
    assert!(
        matches!(unknown, Err(Error::BindingUnknown { .. })),
        "{unknown:?}"
    );
    assert_eq!(node_of(&cluster, "first").await, None);
    assert!(allocation_of(&cluster, "first").await.is_some());
    assert_eq!(lock_holder(&cluster).await.as_deref(), Some("first"));
    let second = pod(&cluster, "second", 1000).await;
    assert!(matches!(
        binder.bind(&second, None).await,
        Err(Error::LockBusy { .. })
    ));
    binder.bind(&first, None).await.expect("the retry binds");
    assert_eq!(node_of(&cluster, "first").await.as_deref(), Some(NODE));
    let allocation = allocation_of(&cluster, "first").await.unwrap();
    assert_eq!(allocation.spec.pod_uid, first.pod_uid);
    assert_eq!(lock_holder(&cluster).await.as_deref(), Some("first"));
}

/// M1: the holder is bound and its Allocate has not come (a lagging
/// kubelet) when its lock lapses. Neither the lifecycle controller nor the
/// next Bind hands the node over (before, both did, and the late Allocate
/// was then answered with the next pod's slice).
#[tokio::test]
async fn a_lapsed_lock_stays_with_a_holder_bound_and_not_yet_served() {
    let (cluster, binder) = setup_with(Faults::new(Fault::DropAnswer, 0), 2).await;
    let first = pod(&cluster, "first", 1000).await;
    binder.bind(&first, None).await.expect("first binds");
    let lock = Api::<NodeLock>::all(cluster.client.clone())
        .get(NODE)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(lock.spec.expires_at.0 < k8s_openapi::jiff::Timestamp::now());
    let second = pod(&cluster, "second", 1000).await;
    let waited = binder.bind(&second, None).await;
    assert!(
        matches!(waited, Err(Error::LockBusy { .. })),
        "the lapsed lock's holder is bound and unserved: {waited:?}"
    );
    assert_eq!(lock_holder(&cluster).await.as_deref(), Some("first"));
    assert_eq!(node_of(&cluster, "second").await, None);
}

/// What preemption's status patches rely on (review 2026-12-01, L4): a
/// patch naming a UID other than the pod's is refused, so the
/// `DisruptionTarget` mark and the preemptor's `nominatedNodeName` never
/// reach a new pod of the same name.
#[tokio::test]
async fn a_status_patch_naming_another_uid_is_refused() {
    let (cluster, _binder) = setup(Faults::new(Fault::DropAnswer, 0)).await;
    let victim = pod(&cluster, "victim", 1000).await;
    let pods =
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cluster.client.clone(), "default");
    let mark = |uid: &str| {
        json!({"metadata": {"uid": uid}, "status": {"conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
            "message": "test", "lastTransitionTime": "2026-12-02T00:00:00Z"}]}})
    };
    pods.patch_status(
        "victim",
        &PatchParams::default(),
        &Patch::Strategic(mark("another-uid")),
    )
    .await
    .expect_err("a patch naming another UID is refused");
    pods.patch_status(
        "victim",
        &PatchParams::default(),
        &Patch::Strategic(mark(&victim.pod_uid)),
    )
    .await
    .expect("the pod's own UID is patched");
    let conditions = pods
        .get("victim")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap();
    assert!(conditions.iter().any(|c| c.type_ == "DisruptionTarget"));
}

/// L2: kube-scheduler gives up on a Bind after its `httpTimeout` and closes
/// the connection, which drops the extender's handler. Before, a Bind
/// dropped while it waited for the node's lock left its reservation in the
/// ledger for good (no rollback ran); now it runs to its end on its own task
/// and undoes what it began.
#[tokio::test]
async fn a_bind_whose_caller_hangs_up_still_undoes_its_reservation() {
    use tokio::io::AsyncWriteExt;

    let (cluster, binder) = setup(Faults::new(Fault::DropAnswer, 0)).await;
    let holder = pod(&cluster, "holder", 1000).await;
    binder.bind(&holder, None).await.expect("the holder binds");
    let waiter = pod(&cluster, "waiter", 1000).await;
    let body = serde_json::to_string(&waiter).unwrap();
    let mut connection = tokio::net::TcpStream::connect(("127.0.0.1", cluster.extender_port))
        .await
        .unwrap();
    let request = format!(
        "POST /bind HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    connection.write_all(request.as_bytes()).await.unwrap();
    let reserved = || {
        cluster
            .projection
            .read()
            .allocations_on(NODE)
            .any(|(key, _)| key.name == "waiter")
    };
    tessera_testkit::eventually("the waiter reserved", Duration::from_secs(5), async || {
        reserved()
    })
    .await;
    // Hang up while the Bind waits for the holder's lock (3 s).
    drop(connection);
    tessera_testkit::eventually(
        "the hung-up Bind's reservation undone",
        Duration::from_secs(15),
        async || !reserved(),
    )
    .await;
    assert_eq!(lock_holder(&cluster).await.as_deref(), Some("holder"));
    assert_eq!(node_of(&cluster, "waiter").await, None);
}

/// L3: a pod may be named as a DRA claim's mirror (`claim-<claim UID>`).
/// Bind took the mirror for "an earlier pod of the same name" and deleted it,
/// freeing the prepared claim's slices in the ledger; now it refuses to bind
/// the pod there and the mirror stays.
#[tokio::test]
async fn a_pod_named_as_a_claims_mirror_never_replaces_it() {
    let (cluster, binder) = setup(Faults::new(Fault::DropAnswer, 0)).await;
    let mirror = tessera_api::testing::allocation("claim-c1", "claim-pod-uid", NODE)
        .namespace("default")
        .claim("c", "c1")
        .container(tessera_api::testing::container(
            "gpu",
            vec![tessera_api::testing::slice("GPU-safe-1-0", 0, 8192, 0)],
        ))
        .build();
    let allocations = Api::<VgpuAllocation>::namespaced(cluster.client.clone(), "default");
    let created = allocations
        .create(&kube::api::PostParams::default(), &mirror)
        .await
        .unwrap();
    let named = pod(&cluster, "claim-c1", 1000).await;
    let refused = binder.bind(&named, None).await;
    assert!(
        matches!(&refused, Err(Error::Stale(why)) if why.contains("DRA claim c")),
        "{refused:?}"
    );
    let kept = allocation_of(&cluster, "claim-c1")
        .await
        .expect("the mirror stays");
    assert_eq!(kept.metadata.uid, created.metadata.uid);
    assert_eq!(node_of(&cluster, "claim-c1").await, None);
}
