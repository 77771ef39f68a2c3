//! Device quotas on a real control plane: kube-apiserver, kube-scheduler
//! calling the extender, the webhook and the lifecycle controllers. A
//! namespace's `limits.nvidia.com/gpumem` counts what each pod is given
//! (percentages resolved), holds across racing Binds, shows in the quota's
//! status and in HAMi's metric, and frees room when a pod goes; its
//! `limits.nvidia.com/gpucores` counts a pod of 0 cores (no compute limit)
//! as its GPU's cores.

use tessera_testkit::cluster as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use support::{Cluster, WAIT, spawn_allocate_stand_in};
use tessera_controllers::config::Config;

async fn eventually<F: AsyncFn() -> bool>(what: &str, check: F) {
    tessera_testkit::eventually(what, WAIT, check).await;
}

/// The quota's `status.used` for the GPU memory key, once written.
async fn shown_used(quotas: &Api<ResourceQuota>) -> Option<String> {
    quotas
        .get("gpu")
        .await
        .ok()?
        .status?
        .used?
        .get("limits.nvidia.com/gpumem")
        .map(|q| q.0.clone())
}

/// Creates the ResourceQuota `name` in `default` and waits until the
/// extender has it.
async fn create_quota(
    cluster: &Cluster,
    name: &str,
    hard: serde_json::Value,
) -> Api<ResourceQuota> {
    let quotas: Api<ResourceQuota> = Api::namespaced(cluster.client.clone(), "default");
    let quota: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"hard": hard}}))
            .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    eventually("the extender sees the quota", async || {
        !cluster
            .projection
            .quota_limits("default", &Default::default())
            .is_empty()
    })
    .await;
    quotas
}

#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_at_its_gpu_memory_quota_starts_no_more_pods() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    for node in ["q-1", "q-2"] {
        cluster
            .add_gpu_node(node, "NVIDIA A100-SXM4-80GB", 1, 81920)
            .await;
    }
    // Every pod here names no cores, so each counts a GPU's 100 (M5):
    // at most four hold GPUs at once below.
    let quotas = create_quota(
        &cluster,
        "gpu",
        json!({"limits.nvidia.com/gpumem": "40960", "limits.nvidia.com/gpucores": "400"}),
    )
    .await;

    // A quarter of an 80 GiB GPU counts 20480 MiB, not the 0 a raw
    // request would; 20480 MiB more fills the quota exactly.
    cluster
        .create_pod(
            "quarter",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}),
            json!({}),
        )
        .await;
    cluster.served("quarter").await;
    assert_eq!(
        cluster.allocation("quarter").await.spec.quota["nvidia.com/gpumem"],
        20480
    );
    cluster
        .create_pod(
            "rest",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"}),
            json!({}),
        )
        .await;
    cluster.served("rest").await;
    eventually("the quota's status shows the usage", async || {
        shown_used(&quotas).await.as_deref() == Some("40960")
    })
    .await;
    let metrics = cluster.metrics().await;
    assert!(
        metrics.contains(
            "hami_resource_quota_used{namespace=\"default\",quota_name=\"nvidia.com/gpumem\",limit=\"40960\"} 40960"
        ) && metrics.contains(
            "hami_resource_quota_limit{namespace=\"default\",quota_name=\"nvidia.com/gpumem\"} 40960"
        ),
        "{metrics}"
    );

    // Another pod in MiB is refused at creation, naming the quota.
    let refused = cluster
        .create_raw_pod(json!({
            "metadata": {"name": "one-more"},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/cuda",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}]},
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(
            "the pod's namespace is at its device quota: ResourceQuota \"gpu\" allows limits.nvidia.com/gpumem: 40960; the namespace's pods hold 40960, this pod would add 1000"
        ),
        "{refused}"
    );
    // A percentage is only known on a node: admitted, then held Pending
    // with the reason per node.
    cluster
        .create_pod(
            "tenth",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "10"}),
            json!({}),
        )
        .await;
    let reasons = cluster.failed_scheduling("tenth").await.join("\n");
    assert!(
        reasons.contains("the namespace's pods hold 40960, this pod would add 8192"),
        "{reasons}"
    );

    // When a pod goes, its memory returns to the quota and the waiting pod
    // is scheduled without waiting out kube-scheduler's backoff.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    pods.delete("rest", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    cluster.served("tenth").await;
    eventually("the status follows", async || {
        shown_used(&quotas).await.as_deref() == Some("28672")
    })
    .await;

    // 12288 MiB are left: of two pods of 15 % (12288 MiB) arriving
    // together, both admitted (a percentage counts only on a node), exactly
    // one binds, however their Filters and Binds interleave.
    let fifteen = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "15"});
    tokio::join!(
        cluster.create_pod("race-a", fifteen.clone(), json!({})),
        cluster.create_pod("race-b", fifteen.clone(), json!({})),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let bound: Vec<String> = {
        let mut bound = Vec::new();
        for name in ["race-a", "race-b"] {
            let pod = pods.get(name).await.unwrap();
            if pod.spec.and_then(|s| s.node_name).is_some() {
                bound.push(name.to_owned());
            }
        }
        bound
    };
    assert_eq!(
        bound.len(),
        1,
        "exactly one of the racing pods binds: {bound:?}"
    );
    let waiting = if bound[0] == "race-a" {
        "race-b"
    } else {
        "race-a"
    };
    let reasons = cluster.failed_scheduling(waiting).await.join("\n");
    assert!(reasons.contains("device quota"), "{reasons}");
    let used: u64 = cluster
        .projection
        .read()
        .namespace_used("default")
        .get("nvidia.com/gpumem")
        .copied()
        .unwrap_or(0);
    assert_eq!(used, 40960);

    // Raising the quota lets the waiting pod in.
    let mut raised = quotas.get("gpu").await.unwrap();
    raised.spec.as_mut().unwrap().hard.as_mut().unwrap().insert(
        "limits.nvidia.com/gpumem".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("81920".into()),
    );
    quotas
        .replace("gpu", &PostParams::default(), &raised)
        .await
        .unwrap();
    cluster.served(waiting).await;
}

/// Review finding M5: 0 cores (the default) means no compute limit, so it
/// counts a whole GPU's cores; before, every such pod counted 0 and a cores
/// quota limited nothing.
#[tokio::test(flavor = "multi_thread")]
async fn pods_of_no_cores_count_their_gpu_s_cores_against_a_cores_quota() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster
        .add_gpu_node("c-1", "NVIDIA A100-SXM4-80GB", 2, 81920)
        .await;
    create_quota(
        &cluster,
        "cores",
        json!({"limits.nvidia.com/gpucores": "100"}),
    )
    .await;
    let no_cores = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"});
    cluster
        .create_pod("first", no_cores.clone(), json!({}))
        .await;
    cluster.served("first").await;
    assert_eq!(
        cluster.allocation("first").await.spec.quota["nvidia.com/gpucores"],
        100
    );
    // The node has room (a second GPU), the namespace has not.
    cluster.create_pod("second", no_cores, json!({})).await;
    let reasons = cluster.failed_scheduling("second").await.join("\n");
    assert!(
        reasons.contains(
            "ResourceQuota \"cores\" allows limits.nvidia.com/gpucores: 100; the namespace's pods hold 100, this pod would add 100"
        ),
        "{reasons}"
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let second = pods.get("second").await.unwrap();
    assert_eq!(second.spec.and_then(|s| s.node_name), None, "not bound");
    // A pod that names its cores is refused at creation now: the 0-core
    // pod's 100 count there too.
    let refused = cluster
        .create_raw_pod(json!({
            "metadata": {"name": "thirty"},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/cuda",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "30"}}}]},
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("the namespace's pods hold 100, this pod would add 30"),
        "{refused}"
    );
}

#[tokio::test]
async fn an_explicit_zero_quota_allows_no_gpu_memory() {
    let cluster = Cluster::start(Config::default()).await;
    create_quota(&cluster, "none", json!({"limits.nvidia.com/gpumem": "0"})).await;
    let refused = cluster
        .create_raw_pod(json!({
            "metadata": {"name": "any"},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/cuda",
                "resources": {"limits": {"nvidia.com/gpumem": "1"}}}]},
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("allows limits.nvidia.com/gpumem: 0;"),
        "{refused}"
    );
}
