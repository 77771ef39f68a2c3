//! Time from `kubectl apply` of 100 pods to all Running on two real nodes
//! (containerd + kubelet + node agent with fake GPUs), for single-GPU pods
//! and for plain pods, in one run. Figures go in docs/benchmarks.md.
//!
//! `cargo bench -p tessera-e2e --bench real_nodes` (needs what the real-node
//! tests need: root, containerd, runc, CNI plugins, busybox). `PODS=<n>`
//! changes the burst size.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::{Value, json};
use tessera_e2e::artifacts::Artifacts;
use tessera_e2e::node::{AgentMode, FakeGpu, NodeSpec, RealNode};
use tessera_e2e::stack::Tessera;
use tessera_e2e::{ControlPlane, images};

fn pod(name: &str, gpu: bool) -> Value {
    let mut container = json!({
        "name": "main", "image": images::CUDA_IMAGE,
        "command": ["sleep", "1000000"],
    });
    if gpu {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 5}});
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"burst": if gpu { "gpu" } else { "plain" }}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]},
    })
}

/// Applies `count` pods with one `kubectl apply` and returns the seconds
/// until every one of them runs.
async fn burst(plane: &ControlPlane, pods: &Api<Pod>, count: usize, gpu: bool) -> f64 {
    let kind = if gpu { "gpu" } else { "plain" };
    let items: Vec<Value> = (0..count)
        .map(|i| pod(&format!("{kind}-{i}"), gpu))
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let path = plane.dir().join(format!("{kind}.json"));
    std::fs::write(&path, list.to_string()).unwrap();
    let selector = ListParams::default().labels(&format!("burst={kind}"));
    let start = Instant::now();
    let output = plane
        .kubectl()
        .unwrap()
        .args(["apply", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    loop {
        let list = pods.list(&selector).await.unwrap();
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == count {
            return start.elapsed().as_secs_f64();
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "{running} of {count} {kind} pods running after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn delete_all(pods: &Api<Pod>, kind: &str) {
    let selector = ListParams::default().labels(&format!("burst={kind}"));
    pods.delete_collection(&DeleteParams::default(), &selector)
        .await
        .unwrap();
    while !pods.list(&selector).await.unwrap().items.is_empty() {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let count: usize = std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let artifacts = Artifacts::locate().unwrap();
    let plane = ControlPlane::start().await.unwrap();
    let archives = images::build(&plane.dir().join("images"), &artifacts).unwrap();
    let _tessera = Tessera::deploy(&plane, &artifacts).await.unwrap();
    let mut nodes = Vec::new();
    for name in ["bench-a", "bench-b"] {
        let spec = NodeSpec {
            name: name.into(),
            gpus: FakeGpu::many(name, 8, "NVIDIA A100-SXM4-80GB", 81920, 4),
            labels: BTreeMap::from([("gpu".to_owned(), "on".to_owned())]),
            agent: AgentMode::Host,
        };
        nodes.push(
            RealNode::start(&plane, &spec, &artifacts, &archives)
                .await
                .unwrap(),
        );
    }
    let pods: Api<Pod> = Api::namespaced(plane.client().await.unwrap(), "default");
    // One warm-up pod of each kind: the first container on a node pays for
    // unpacking the image into its snapshotter.
    for gpu in [false, true] {
        burst(&plane, &pods, 1, gpu).await;
        delete_all(&pods, if gpu { "gpu" } else { "plain" }).await;
    }
    let plain = burst(&plane, &pods, count, false).await;
    delete_all(&pods, "plain").await;
    let gpu = burst(&plane, &pods, count, true).await;
    println!(
        "{count} pods on 2 real nodes, kubectl apply to all Running: plain {plain:.2} s ({:.1} pods/s), single-GPU {gpu:.2} s ({:.1} pods/s), GPU/plain time {:.2}",
        count as f64 / plain,
        count as f64 / gpu,
        gpu / plain
    );
    delete_all(&pods, "gpu").await;
    drop(nodes);
}
