//! Tessera installed with `helm install` from `charts/tessera` on real nodes
//! (containerd + kubelet v1.36), from the locally built images: the agents run
//! as the chart's DaemonSet pods, kube-scheduler and tessera-controller as its
//! Deployment; pods reach the API server through the `kubernetes` Service
//! routed by a real kube-proxy, and the API server reaches the webhook through
//! its Service. One cluster goes through a user's whole cycle:
//!
//! 1. `helm install --wait`: a GPU pod gets its slice, enforced in its container,
//!    and its placement is one trace in Jaeger (admit → filter, bind →
//!    the agent's allocate), read back from Jaeger's query API;
//! 2. `helm upgrade` changing the split count keeps running pods and their
//!    allocations, and the new count reaches the GpuNodes;
//! 3. the webhook down: GPU pods are refused naming the webhook, other pods
//!    are unaffected;
//! 4. `helm uninstall` leaves no Tessera pod, webhook, NodeLock or agent Lease
//!    (the CRDs and the guard stay; each agent deletes its Lease as it stops)
//!    and GPU pods are refused saying Tessera is absent; installing again works.
//!
//! Needs what the real-node tests need (root, containerd, runc, CNI plugins,
//! iptables); `TESSERA_SKIP_REAL_NODES=1` skips it, never silently.

use std::time::Duration;

use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration, coordination::v1::Lease, core::v1::Pod,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use tessera_api::v1alpha1::{AllocationPhase, GpuNode, NodeLock, VgpuAllocation};
use tessera_e2e::testkit::{gpu_pod, number, phase, section};
use tessera_e2e::{
    Lifetime,
    artifacts::Artifacts,
    cluster::{LocalCluster, NAMESPACE, NodeGpus},
    images,
    jaeger::{self, Jaeger},
    node::FakeGpu,
};

const WAIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;

/// A manifest as a typed Pod.
fn pod(manifest: serde_json::Value) -> Pod {
    serde_json::from_value(manifest).unwrap()
}

fn plain_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "sleep 3600"],
            }],
        },
    }))
    .unwrap()
}

async fn wait_for<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    tessera_e2e::testkit::wait_for(what, WAIT, check).await
}

fn logs(cluster: &LocalCluster, pod: &str) -> String {
    cluster.plane.logs("default", pod).unwrap()
}

fn refusal(result: Result<Pod, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("the pod was not refused: {other:?}"),
    }
}

/// The pod's placement is one trace in Jaeger: the webhook's `admit` is
/// its root; `filter` and `bind` (kube-scheduler asks no `prioritize` when
/// one node fits) its children, in order; the node agent's `allocate` is
/// bind's child; each with the pod's identity and its own attributes.
async fn check_trace(jaeger: &Jaeger, uid: &str, pod: &str, node: &str) {
    // The exporters send every 5 s, Jaeger stores every 1 s.
    let trace = wait_for("the pod's whole trace in Jaeger", async || {
        jaeger
            .pod_trace(jaeger::CONTROLLER_SERVICE, uid)
            .await
            .unwrap()
            .filter(|t| !t.named("allocate").is_empty())
    })
    .await;
    let tree = trace.tree();
    let only = |name: &str| {
        let spans = trace.named(name);
        assert_eq!(spans.len(), 1, "one {name} span:\n{tree}");
        spans[0]
    };
    let admit = only("admit");
    assert_eq!(admit.service, jaeger::CONTROLLER_SERVICE, "{tree}");
    assert!(admit.parent.is_none(), "admit is the root:\n{tree}");
    assert_eq!(admit.tag("outcome"), Some("mutated"), "{tree}");
    let filter = only("filter");
    let bind = only("bind");
    let allocate = only("allocate");
    for span in [filter, bind] {
        assert_eq!(span.service, jaeger::CONTROLLER_SERVICE, "{tree}");
        assert_eq!(span.parent.as_deref(), Some(admit.id.as_str()), "{tree}");
    }
    assert_eq!(allocate.service, jaeger::AGENT_SERVICE, "{tree}");
    assert_eq!(allocate.parent.as_deref(), Some(bind.id.as_str()), "{tree}");
    assert!(admit.start_us <= filter.start_us, "{tree}");
    assert!(filter.start_us <= bind.start_us, "{tree}");
    assert!(bind.start_us <= allocate.start_us, "{tree}");
    for span in &trace.spans {
        assert_eq!(span.tag("k8s.namespace.name"), Some("default"), "{tree}");
        assert_eq!(span.tag("k8s.pod.name"), Some(pod), "{tree}");
        if span.name != "admit" {
            // The API server gives the pod its UID after admission.
            assert_eq!(span.tag("k8s.pod.uid"), Some(uid), "{}:\n{tree}", span.name);
        }
    }
    assert_eq!(filter.tag("feasible"), Some("1"), "{tree}");
    assert_eq!(bind.tag("k8s.node.name"), Some(node), "{tree}");
    assert_eq!(allocate.tag("k8s.node.name"), Some(node), "{tree}");
    let devices = bind.tag("devices").unwrap_or_default();
    assert!(devices.starts_with(&format!("cuda=GPU-{node}-")), "{tree}");
    assert!(
        bind.events
            .iter()
            .any(|e| e.get("event").map(String::as_str) == Some("bound")),
        "{tree}"
    );
    eprintln!("trace {} of {pod}:\n{tree}", trace.id);
}

/// Every GpuNode's devices have `split` slices.
async fn split_count(client: &Client) -> Vec<u32> {
    let nodes = Api::<GpuNode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    nodes
        .items
        .iter()
        .flat_map(|n| n.status.iter().flat_map(|s| s.devices.iter()))
        .map(|d| d.split_count)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn install_serve_upgrade_survive_webhook_loss_uninstall_and_reinstall() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let nodes = [NodeGpus {
        name: "chart-node".into(),
        gpus: FakeGpu::many("chart-node", 2, "NVIDIA A100-SXM4-80GB", 81920, 1),
        ..Default::default()
    }];
    // Traces go to a Jaeger on this machine, as in the demo.
    let ports = jaeger::Ports::choose(&tessera_e2e::host_ip().unwrap()).unwrap();
    let mut cluster = LocalCluster::start_with(
        None,
        Lifetime::Tied,
        &nodes,
        &artifacts,
        json!({"otel": {"endpoint": ports.endpoint()}}),
    )
    .await
    .unwrap();
    let jaeger = Jaeger::start(&cluster.plane, &ports).await.unwrap();
    let client = cluster.plane.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // 1. A GPU pod gets its slice; the interposer enforces it in the container.
    const CHUNK: u64 = 64 * MIB;
    let script = format!(
        "echo '--- meminfo'; cuda-probe meminfo 0; echo '--- alloc'; \
         cuda-probe alloc plain {CHUNK} 1000; echo '--- end'; sleep 3600"
    );
    pods.create(
        &PostParams::default(),
        &pod(gpu_pod("sliced", 1024, None, &script)),
    )
    .await
    .unwrap();
    let out = wait_for("sliced to print its probe", async || {
        let out = logs(&cluster, "sliced");
        out.contains("--- end").then_some(out)
    })
    .await;
    let meminfo = section(&out, "--- meminfo");
    assert_eq!(number(&meminfo, "total"), 1024 * MIB, "{out}");
    let alloc = section(&out, "--- alloc");
    assert_eq!(
        number(&alloc, "last_rc"),
        2,
        "stops with CUDA_ERROR_OUT_OF_MEMORY: {out}"
    );
    assert!(number(&alloc, "allocated") * CHUNK <= 1024 * MIB, "{out}");
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), "default");
    let allocation = allocations.get("sliced").await.unwrap();
    assert_eq!(
        allocation.status.as_ref().and_then(|s| s.phase),
        Some(AllocationPhase::Allocated)
    );
    // The agent pod's metrics, scraped over the pod network.
    let metrics = cluster.agent_metrics("chart-node").await.unwrap();
    let text = tessera_e2e::http::get_body(&metrics, "/metrics")
        .await
        .unwrap();
    assert!(
        text.contains("tessera_gpu_memory_allocated_bytes"),
        "{text}"
    );

    let uid = pods.get("sliced").await.unwrap().metadata.uid.unwrap();
    check_trace(&jaeger, &uid, "sliced", "chart-node").await;

    // A GPU pod may not lift its own limit through its env: the kubelet
    // puts the container's env after the device plugin's.
    let mut lifting = gpu_pod("lifting", 512, None, "cuda-probe meminfo 0; sleep 3600");
    lifting["spec"]["containers"][0]["env"] =
        json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "8g"}]);
    let message = refusal(
        pods.create(&PostParams::default(), &pod(lifting.clone()))
            .await,
    );
    assert!(
        message.contains("env[0] CUDA_DEVICE_MEMORY_LIMIT_0: the node agent sets this variable"),
        "{message}"
    );

    // 2. An upgrade with a new split count: running pods and their
    // allocations stay, the GpuNodes get the new count. It also lets pods
    // set the enforcement variables: admitted, the container's value still
    // does not win over the agent's, because the interposer reads its limits
    // from the agent's read-only limits file and refuses CUDA when the
    // environment disagrees.
    assert!(split_count(&client).await.iter().all(|&s| s == 10));
    let uid = pods.get("sliced").await.unwrap().metadata.uid;
    cluster
        .helm_install(&[
            "--set",
            "nodeDefaults.deviceSplitCount=4",
            "--set",
            "config.allowEnforcementEnv=true",
        ])
        .await
        .unwrap();
    // Until the old controller pod, still behind the Service for a moment
    // after the rollout, is gone.
    wait_for("the upgraded webhook to admit the pod", async || {
        pods.create(&PostParams::default(), &pod(lifting.clone()))
            .await
            .ok()
    })
    .await;
    let out = wait_for("the lifting pod's refusal", async || {
        let out = logs(&cluster, "lifting");
        out.contains("refusing CUDA").then_some(out)
    })
    .await;
    assert!(
        out.contains(
            "CUDA_DEVICE_MEMORY_LIMIT_0=\"8g\" in the environment, but the node agent's limits file /var/run/tessera/limits/limits.env says \"512m\""
        ),
        "the pod's own CUDA_DEVICE_MEMORY_LIMIT_0 does not replace the agent's 512 MiB: {out}"
    );
    assert!(!out.contains("total="), "{out}");
    wait_for("the GpuNodes to have split count 4", async || {
        let counts = split_count(&client).await;
        (!counts.is_empty() && counts.iter().all(|&s| s == 4)).then_some(())
    })
    .await;
    let after = pods.get("sliced").await.unwrap();
    assert_eq!(after.metadata.uid, uid, "the upgrade replaced the GPU pod");
    assert_eq!(phase(&after), "Running");
    assert_eq!(
        allocations.get("sliced").await.unwrap().metadata.uid,
        allocation.metadata.uid,
        "the upgrade replaced the allocation"
    );

    // 3. The webhook down: GPU pods are refused naming it; other pods run.
    scale_scheduler(&cluster, 0);
    wait_for("the scheduler pods to go", async || {
        cluster
            .pods("scheduler")
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    let message = refusal(
        pods.create(
            &PostParams::default(),
            &pod(gpu_pod("while-down", 512, None, "sleep 1")),
        )
        .await,
    );
    assert!(message.contains("pods.tessera.dev"), "{message}");
    pods.create(&PostParams::default(), &plain_pod("plain"))
        .await
        .unwrap();
    wait_for("the plain pod to run", async || {
        (phase(&pods.get("plain").await.unwrap()) == "Running").then_some(())
    })
    .await;
    scale_scheduler(&cluster, 1);

    // 4. Uninstall: nothing of Tessera's is left but the CRDs and the guard,
    // which refuses GPU pods saying why; installing again works.
    pods.delete("sliced", &DeleteParams::default())
        .await
        .unwrap();
    cluster.helm_uninstall().unwrap();
    wait_for("Tessera's pods to go", async || {
        let left: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        left.is_empty().then_some(())
    })
    .await;
    let webhooks = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(webhooks.items.is_empty(), "{webhooks:?}");
    // A served pod's lock stays, free, like the GpuNodes (state, not
    // release resources), or the stopping agent took it (an agent refused
    // because Helm removed its RBAC first leaves it free); no pod holds one.
    let locks = Api::<NodeLock>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let existing = Api::<VgpuAllocation>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let held: Vec<&NodeLock> = locks
        .iter()
        .filter(|l| !l.spec.draining && l.held_among(&existing))
        .collect();
    assert!(held.is_empty(), "{held:?}");
    // The agent deletes its Lease when it stops (SIGTERM from the kubelet).
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    wait_for("the agent's Lease to go", async || {
        leases
            .get_opt("tessera-agent-chart-node")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let message = refusal(
        pods.create(
            &PostParams::default(),
            &pod(gpu_pod("absent", 512, None, "sleep 1")),
        )
        .await,
    );
    assert!(message.contains("Tessera is not installed"), "{message}");

    cluster.helm_install(&[]).await.unwrap();
    pods.create(
        &PostParams::default(),
        &pod(gpu_pod(
            "again",
            512,
            None,
            "cuda-probe meminfo 0; sleep 3600",
        )),
    )
    .await
    .unwrap();
    wait_for("the pod after reinstalling to run", async || {
        (phase(&pods.get("again").await.unwrap()) == "Running").then_some(())
    })
    .await;

    // The reinstalled agent creates and renews its Lease again.
    let lease = wait_for("the reinstalled agent's Lease", async || {
        leases.get_opt("tessera-agent-chart-node").await.unwrap()
    })
    .await;
    assert!(lease.spec.and_then(|s| s.renew_time).is_some());
}

fn scale_scheduler(cluster: &LocalCluster, replicas: u32) {
    let output = cluster
        .plane
        .kubectl()
        .unwrap()
        .args(["-n", NAMESPACE, "scale", "deployment/tessera-scheduler"])
        .arg(format!("--replicas={replicas}"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
