//! Device-aware preemption end to end on a real control plane: the real
//! kube-scheduler calling Tessera's extender, the lifecycle controllers, a
//! node agent with fake GPUs and a kubelet simulator that speaks the real
//! device-plugin protocol and confirms deletions as a kubelet does.

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    core::v1::{Node, Pod, ResourceQuota},
    scheduling::v1::PriorityClass,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tessera_api::v1alpha1::{AllocationPhase, VgpuAllocation};
use tessera_controllers::config::Config;
use tessera_testkit::cluster::Cluster;

mod common;

use common::{GpuHost, allocation, eventually, wait_published};

async fn priority_class(client: &Client, name: &str, value: i32) {
    let class: PriorityClass = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": name}, "value": value,
    }))
    .unwrap();
    Api::<PriorityClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
}

/// A pod of `class` asking one GPU with `mib` MiB.
async fn gpu_pod(cluster: &Cluster, name: &str, class: &str, mib: u64) {
    gpu_pod_on(cluster, name, class, mib, json!({})).await;
}

/// The same, for nodes with the labels `selector`.
async fn gpu_pod_on(cluster: &Cluster, name: &str, class: &str, mib: u64, selector: Value) {
    let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string()});
    pod_with(cluster, name, class, limits, selector).await;
}

/// A pod of `class` with `limits`, for nodes with the labels `selector`.
async fn pod_with(cluster: &Cluster, name: &str, class: &str, limits: Value, selector: Value) {
    cluster
        .create_raw_pod(json!({
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "tessera-scheduler",
                "nodeSelector": selector,
                "priorityClassName": class,
                "containers": [{"name": "main", "image": "example.invalid/cuda", "resources": {"limits": limits}}],
            },
        }))
        .await
        .unwrap();
}

async fn exists(client: &Client, pod: &str) -> bool {
    Api::<Pod>::namespaced(client.clone(), "default")
        .get_opt(pod)
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn a_higher_priority_pod_displaces_exactly_the_pods_whose_slices_it_needs() {
    let cluster = Cluster::start(Config::default()).await;
    let client = cluster.client.clone();
    let host = GpuHost::start(&cluster, "pre-1", 2).await;
    wait_published(&cluster, &host, 2).await;
    priority_class(&client, "batch", 100).await;
    priority_class(&client, "serving", 1000).await;

    // GPU 0 (80 GiB): batch-a, 60,000 MiB. GPU 1: serving-c and batch-b,
    // 30,000 MiB each (spread takes the emptier GPU; batch-b fits only
    // there).
    for (pod, class, mib) in [
        ("batch-a", "batch", 60_000),
        ("serving-c", "serving", 30_000),
        ("batch-b", "batch", 30_000),
    ] {
        gpu_pod(&cluster, pod, class, mib).await;
        host.served(pod).await;
        cluster.served(pod).await;
    }
    assert_eq!(
        allocation(&client, "batch-a").await.spec.totals.devices,
        "GPU-pre-1-0"
    );
    assert_eq!(
        allocation(&client, "batch-b").await.spec.totals.devices,
        "GPU-pre-1-1"
    );
    assert_eq!(
        allocation(&client, "batch-a").await.spec.priority,
        Some(100)
    );

    // 70,000 MiB fit no GPU. Only GPU 0 can be freed enough (serving-c
    // outranks the pod on GPU 1), so batch-a goes and batch-b stays,
    // although it has the lower priority too.
    let started = Instant::now();
    gpu_pod(&cluster, "urgent", "serving", 70_000).await;
    host.served("urgent").await;
    cluster.served("urgent").await;
    let took = started.elapsed();
    let urgent = allocation(&client, "urgent").await;
    assert_eq!(urgent.spec.totals.devices, "GPU-pre-1-0");
    assert_eq!(urgent.spec.nomination, None, "Bind replaced the hold");
    assert!(!exists(&client, "batch-a").await, "batch-a was preempted");
    for survivor in ["batch-b", "serving-c"] {
        assert!(exists(&client, survivor).await, "{survivor} was spared");
        assert_eq!(
            allocation(&client, survivor)
                .await
                .status
                .and_then(|s| s.phase),
            Some(AllocationPhase::Allocated)
        );
    }
    println!("preemption: urgent pod created to served in {took:?}");

    // Over its namespace's device quota, a pod preempts nothing. Admitted
    // while there was room, it waits for a node label; meanwhile its
    // namespace's quota is lowered to what the namespace holds (130,000 MiB).
    gpu_pod_on(
        &cluster,
        "greedy",
        "serving",
        40_000,
        json!({"pool": "later"}),
    )
    .await;
    cluster.failed_scheduling("greedy").await;
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpu"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "130000"}},
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
    eventually("the extender sees the quota", async || {
        !cluster
            .projection
            .quota_limits("default", &Config::default().request)
            .is_empty()
    })
    .await;
    // Evicting batch-b would make room on GPU 1; the quota forbids it.
    Api::<Node>::all(client.clone())
        .patch(
            "pre-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "later"}}})),
        )
        .await
        .unwrap();
    eventually("the extender refuses greedy for its quota", async || {
        cluster
            .failed_scheduling("greedy")
            .await
            .iter()
            .any(|r| r.contains("device quota") && r.contains("nvidia.com/gpumem"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        exists(&client, "batch-b").await,
        "an over-quota pod preempted"
    );
    let held = Api::<VgpuAllocation>::namespaced(client.clone(), "default")
        .get_opt("greedy")
        .await
        .unwrap();
    assert!(held.is_none(), "an over-quota pod holds slices: {held:?}");
}

#[tokio::test]
async fn kube_schedulers_victims_are_made_enough_for_the_gpus_through_the_preempt_verb() {
    let cluster = Cluster::start(Config::default()).await;
    let client = cluster.client.clone();
    let host = GpuHost::start(&cluster, "verb-1", 3).await;
    wait_published(&cluster, &host, 3).await;
    priority_class(&client, "batch", 100).await;
    priority_class(&client, "serving", 1000).await;

    // The node has 64 CPUs. batch-a holds 40 of them and 10,000 MiB of
    // GPU 0; batch-b and batch-c one CPU and 60,000 MiB of GPU 1 and 2.
    for (pod, cpu, mib) in [
        ("batch-a", "40", 10_000),
        ("batch-b", "1", 60_000),
        ("batch-c", "1", 60_000),
    ] {
        let limits =
            json!({"cpu": cpu, "nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string()});
        pod_with(&cluster, pod, "batch", limits, json!({})).await;
        host.served(pod).await;
        cluster.served(pod).await;
    }

    // 30 CPUs and two GPUs of 75,000 MiB. kube-scheduler's own dry run
    // finds the CPUs by displacing batch-a (its slice frees GPU 0) and asks
    // the preempt verb, which adds the one pod whose GPU completes the
    // pair: batch-c (batch-b, listed first, is given back first).
    let started = Instant::now();
    let limits = json!({"cpu": "30", "nvidia.com/gpu": "2", "nvidia.com/gpumem": "75000"});
    pod_with(&cluster, "urgent", "serving", limits, json!({})).await;
    host.served("urgent").await;
    cluster.served("urgent").await;
    println!(
        "preempt verb: urgent pod created to served in {:?}",
        started.elapsed()
    );
    let urgent = allocation(&client, "urgent").await;
    assert_eq!(urgent.spec.totals.devices, "GPU-verb-1-0,GPU-verb-1-2");
    assert!(!exists(&client, "batch-a").await);
    assert!(!exists(&client, "batch-c").await);
    assert!(exists(&client, "batch-b").await, "batch-b was spared");
    let metrics = cluster.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "tessera_preemptions_total{path=\"verb\"} 1"),
        "{metrics}"
    );
}
