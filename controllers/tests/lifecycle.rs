//! Lifecycle against a real control plane (with kube-controller-manager for
//! garbage collection) and no node agent: allocations and locks are released
//! within seconds of the pod going away, finishing, or being served.

use tessera_testkit::cluster as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use support::Cluster;
use tessera_api::v1alpha1::{AllocationPhase, GpuNodeConfig, NodeLock, VgpuAllocation};
use tessera_controllers::config::Config;

const SECONDS: Duration = Duration::from_secs(10);

async fn eventually<F: AsyncFn() -> bool>(what: &str, check: F) {
    tessera_testkit::eventually(what, SECONDS, check).await;
}

#[tokio::test]
async fn allocations_and_locks_do_not_outlive_their_pods() {
    let cluster = Cluster::start(Config::default()).await;
    cluster.plane.start_controller_manager().await.unwrap();
    cluster
        .add_gpu_node("life-1", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let allocations: Api<VgpuAllocation> = Api::namespaced(cluster.client.clone(), "default");
    let locks: Api<NodeLock> = Api::all(cluster.client.clone());
    let slice = json!({"nvidia.com/gpumem": "1000"});
    let lock_holder = async || {
        locks
            .get_opt("life-1")
            .await
            .unwrap()
            .map(|l| l.spec.holder.name)
    };
    // Held: the lock exists and its holder's allocation has not left Bound.
    let lock_held = async || {
        let Some(lock) = locks.get_opt("life-1").await.unwrap() else {
            return false;
        };
        let allocation = allocations.get_opt(&lock.spec.allocation).await.unwrap();
        lock.held_among(allocation.as_slice())
    };

    // (g) Deleted between bind and Allocate: no agent serves it, so the lock stays until the pod goes.
    cluster.create_pod("doomed", slice.clone(), json!({})).await;
    cluster.node_of("doomed").await;
    assert_eq!(lock_holder().await.as_deref(), Some("doomed"));
    pods.delete("doomed", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("the lock of a deleted pod is released", async || {
        !lock_held().await
    })
    .await;
    eventually("and deleted with the allocation", async || {
        lock_holder().await.is_none()
    })
    .await;
    eventually("the allocation of a deleted pod is deleted", async || {
        allocations.get_opt("doomed").await.unwrap().is_none()
    })
    .await;

    // A served pod: its allocation's `Allocated` releases the lock, which
    // stays, free, for the node's next pod.
    cluster.create_pod("served", slice.clone(), json!({})).await;
    cluster.node_of("served").await;
    assert!(lock_held().await);
    let allocated = json!({"status": {"phase": "Allocated", "servedContainers": ["main"]}});
    allocations
        .patch_status("served", &PatchParams::default(), &Patch::Merge(allocated))
        .await
        .unwrap();
    assert!(!lock_held().await, "released by the allocation's phase");

    // A pod that completes (as a Job's pod does) releases its slices.
    let succeeded = json!({"status": {"phase": "Succeeded"}});
    pods.patch_status("served", &PatchParams::default(), &Patch::Merge(succeeded))
        .await
        .unwrap();
    eventually("a finished pod's allocation is Released", async || {
        let a = allocations.get("served").await.unwrap();
        a.status.and_then(|s| s.phase) == Some(AllocationPhase::Released)
    })
    .await;
    // The projection learns of the release from its own watch, which may
    // deliver the event after the GET above has seen it.
    eventually("released slices are free in the projection", async || {
        cluster.projection.read().node("life-1").unwrap().usage[0].slices == 0
    })
    .await;
    assert_eq!(
        lock_holder().await.as_deref(),
        Some("served"),
        "the lifecycle controller never deletes a lock its holder's allocation released"
    );

    // Slices held for a preemptor that never binds (here: no node matches
    // its selector) are released when the hold lapses.
    let waiting: Pod = serde_json::from_value(json!({
        "metadata": {"name": "preemptor"},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "main", "image": "example.invalid/cuda"}]},
    }))
    .unwrap();
    let waiting = pods.create(&PostParams::default(), &waiting).await.unwrap();
    let lapses =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(2);
    let hold = tessera_api::testing::allocation(
        "preemptor",
        waiting.metadata.uid.as_deref().unwrap(),
        "life-1",
    )
    .container(tessera_api::testing::container(
        "main",
        vec![tessera_api::testing::slice("GPU-life-1-0", 0, 40_000, 50)],
    ))
    .held_until(k8s_openapi::jiff::Timestamp::from_second(lapses.as_second()).unwrap())
    .build();
    let hold = VgpuAllocation {
        status: None,
        ..hold
    };
    allocations
        .create(&PostParams::default(), &hold)
        .await
        .unwrap();
    eventually("the projection holds the slices", async || {
        cluster.projection.read().node("life-1").unwrap().usage[0].memory_mib == 40_000
    })
    .await;
    eventually("a lapsed hold is Released", async || {
        let status = allocations.get("preemptor").await.unwrap().status;
        status.as_ref().and_then(|s| s.phase) == Some(AllocationPhase::Released)
            && status.and_then(|s| s.message).as_deref()
                == Some(tessera_controllers::lifecycle_rules::HOLD_LAPSED)
    })
    .await;
    eventually(
        "the lapsed hold's memory is free in the projection",
        async || cluster.projection.read().node("life-1").unwrap().usage[0].memory_mib == 0,
    )
    .await;
}

#[tokio::test]
async fn gpu_node_config_status_reports_matches_and_conflicts() {
    let cluster = Cluster::start(Config::default()).await;
    cluster
        .add_gpu_node("pool-1", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    cluster
        .add_gpu_node("pool-2", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    cluster
        .add_gpu_node("other", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    let configs: Api<GpuNodeConfig> = Api::all(cluster.client.clone());
    let config = |name: &str, spec: serde_json::Value| -> GpuNodeConfig {
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig", "metadata": {"name": name}, "spec": spec})).unwrap()
    };
    configs
        .create(
            &PostParams::default(),
            &config(
                "pool",
                json!({"nodeNames": ["pool-*"], "deviceSplitCount": 4}),
            ),
        )
        .await
        .unwrap();
    configs
        .create(
            &PostParams::default(),
            &config(
                "one",
                json!({"nodeNames": ["pool-2"], "deviceSplitCount": 8}),
            ),
        )
        .await
        .unwrap();
    eventually("status lists matched nodes and the conflict", async || {
        let pool = configs
            .get("pool")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let one = configs.get("one").await.unwrap().status.unwrap_or_default();
        pool.matched_nodes == ["pool-1", "pool-2"]
            && one.matched_node_count == 1
            && pool.conflicts.iter().any(|c| {
                c.node == "pool-2" && c.field == "deviceSplitCount" && c.configs == ["one", "pool"]
            })
            && one.conflicts.len() == 1
    })
    .await;
}
