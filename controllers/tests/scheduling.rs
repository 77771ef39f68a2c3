//! End-to-end scheduling with a real kube-scheduler calling Tessera's
//! extender: placements, reasons in FailedScheduling events, policies.
//!
//! No node agent exists yet: `spawn_allocate_stand_in` plays its Allocate
//! step (allocation Allocated, lock released) so locks do not pile up.

use tessera_testkit::cluster as support;

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::{Cluster, WAIT, spawn_allocate_stand_in};
use tessera_api::v1alpha1::{AllocationPhase, GpuNode};
use tessera_controllers::config::Config;

#[tokio::test]
async fn half_gpus_share_one_device_and_a_larger_request_goes_elsewhere() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster
        .add_gpu_node("node-a", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    cluster
        .add_gpu_node("node-b", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;

    let half = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"});
    cluster.create_pod("half-1", half.clone(), json!({})).await;
    let first = cluster.node_of("half-1").await;
    // One after another: a node still in its bind-to-Allocate window scores
    // lowest, so a pod arriving inside it is spread (documented rule).
    cluster.served("half-1").await;
    cluster.create_pod("half-2", half, json!({})).await;
    assert_eq!(
        cluster.node_of("half-2").await,
        first,
        "binpack puts the second half on the same GPU"
    );
    cluster
        .create_pod(
            "sixty",
            json!({"nvidia.com/gpumem-percentage": "60"}),
            json!({}),
        )
        .await;
    let other = cluster.node_of("sixty").await;
    assert_ne!(other, first, "60% no longer fits the shared GPU");

    let a1 = cluster.allocation("half-1").await;
    let a2 = cluster.allocation("half-2").await;
    assert_eq!(
        a1.spec.totals.devices, a2.spec.totals.devices,
        "both halves on one GPU"
    );
    assert_eq!(a1.spec.totals.memory_mib + a2.spec.totals.memory_mib, 81920);
    assert_eq!(
        cluster.allocation("sixty").await.spec.totals.memory_mib,
        49152
    );
    let owner = a1.metadata.owner_references.clone().unwrap();
    assert_eq!(
        (owner[0].kind.as_str(), owner[0].name.as_str()),
        ("Pod", "half-1")
    );
    let metrics = cluster.metrics().await;
    for needle in [
        "tessera_extender_request_duration_seconds_count{verb=\"filter\",outcome=\"ok\"}",
        "tessera_extender_request_duration_seconds_count{verb=\"bind\",outcome=\"ok\"} 3",
        "tessera_bind_lock_wait_duration_seconds_count 3",
        "tessera_gpu_nodes 2",
    ] {
        assert!(
            metrics.contains(needle),
            "metrics lack {needle}:\n{metrics}"
        );
    }
    assert!(metrics.contains("tessera_allocations{phase="), "{metrics}");
    let phase = |a: &tessera_api::v1alpha1::VgpuAllocation| a.status.as_ref().and_then(|s| s.phase);
    assert!(
        matches!(
            phase(&a1),
            Some(AllocationPhase::Bound | AllocationPhase::Allocated)
        ),
        "{:?}",
        a1.status
    );
}

#[tokio::test]
async fn a_pod_that_fits_nowhere_stays_pending_with_our_reason() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster.add_gpu_node("small-1", "Tesla T4", 2, 15360).await;
    cluster
        .create_pod(
            "filler",
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10000"}),
            json!({}),
        )
        .await;
    cluster.node_of("filler").await;
    // Valid (a T4 has 15360 MiB), but only 5360 MiB are left on each GPU.
    cluster
        .create_pod(
            "waiting",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}),
            json!({}),
        )
        .await;
    let joined = cluster.failed_scheduling("waiting").await.join("\n");
    assert!(
        joined
            .contains("container \"main\" needs 1 GPU with 8000 MiB and 0 cores; 0 of 2 GPUs fit"),
        "{joined}"
    );
    assert!(
        joined.contains("2 GPUs without 8000 MiB free (largest free is 5360 MiB on GPU-small-1-0)"),
        "{joined}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_pod_goes_to_a_node_whose_agent_is_not_ready() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster
        .add_gpu_node("restarting-1", "Tesla T4", 1, 15360)
        .await;
    let ready = |status: &str, reason: &str| {
        json!({"status": {"conditions": [{
            "type": "Ready", "status": status, "reason": reason,
            "message": "the device plugin is not registered with the kubelet",
            "lastTransitionTime": "2026-11-22T00:00:00Z",
        }]}})
    };
    let gpu_nodes: Api<GpuNode> = Api::all(cluster.client.clone());
    gpu_nodes
        .patch_status(
            "restarting-1",
            &PatchParams::default(),
            &Patch::Merge(ready("False", "NotRegistered")),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while cluster
        .projection
        .read()
        .not_ready("restarting-1")
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "projection never saw Ready=False"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster
        .create_pod("held-back", json!({"nvidia.com/gpu": "1"}), json!({}))
        .await;
    let joined = cluster.failed_scheduling("held-back").await.join("\n");
    assert!(
        joined.contains("node agent not ready (the kubelet would reject the pod): NotRegistered"),
        "{joined}"
    );
    // Once the agent is registered again the pod goes there: the agent
    // marks its GpuNode Ready and mirrors it on the Node, an event on which
    // kube-scheduler retries the pod at once.
    gpu_nodes
        .patch_status(
            "restarting-1",
            &PatchParams::default(),
            &Patch::Merge(ready("True", "AllGpusHealthy")),
        )
        .await
        .unwrap();
    while cluster
        .projection
        .read()
        .not_ready("restarting-1")
        .is_some()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client.clone());
    nodes
        .patch(
            "restarting-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                tessera_api::names::node_annotations::GPU_READY: "True",
            }}})),
        )
        .await
        .unwrap();
    assert_eq!(cluster.node_of("held-back").await, "restarting-1");
}

/// The GPU UUIDs of a pod's allocation.
async fn devices_of(cluster: &Cluster, pod: &str) -> String {
    cluster.allocation(pod).await.spec.totals.devices
}

#[tokio::test]
async fn binpack_and_spread_place_differently() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster
        .add_gpu_node("n1", "NVIDIA A100-SXM4-80GB", 2, 81920)
        .await;
    cluster
        .add_gpu_node("n2", "NVIDIA A100-SXM4-80GB", 2, 81920)
        .await;
    let tenth = json!({"nvidia.com/gpumem-percentage": "10"});

    cluster
        .create_pod(
            "big",
            json!({"nvidia.com/gpumem-percentage": "50"}),
            json!({}),
        )
        .await;
    let x = cluster.node_of("big").await;
    cluster.served("big").await;
    let y = if x == "n1" { "n2" } else { "n1" };
    assert_eq!(devices_of(&cluster, "big").await, format!("GPU-{x}-0"));

    cluster
        .create_pod(
            "spread-node",
            tenth.clone(),
            json!({"hami.io/node-scheduler-policy": "spread"}),
        )
        .await;
    assert_eq!(
        cluster.node_of("spread-node").await,
        y,
        "node spread picks the emptier node"
    );
    cluster.served("spread-node").await;

    cluster
        .create_pod("default-policies", tenth.clone(), json!({}))
        .await;
    assert_eq!(
        cluster.node_of("default-policies").await,
        x,
        "node binpack (default) picks the fuller node"
    );
    cluster.served("default-policies").await;
    assert_eq!(
        devices_of(&cluster, "default-policies").await,
        format!("GPU-{x}-1"),
        "GPU spread (default) picks the empty GPU"
    );

    cluster
        .create_pod(
            "binpack-gpu",
            tenth,
            json!({"hami.io/gpu-scheduler-policy": "binpack"}),
        )
        .await;
    assert_eq!(cluster.node_of("binpack-gpu").await, x);
    assert_eq!(
        devices_of(&cluster, "binpack-gpu").await,
        format!("GPU-{x}-0"),
        "GPU binpack picks the fullest GPU"
    );
}

#[tokio::test]
async fn gpu_type_and_uuid_annotations_steer_placement() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster
        .add_gpu_node("a100", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    cluster
        .add_gpu_node("h100", "NVIDIA H100 80GB HBM3", 1, 81920)
        .await;
    let small = json!({"nvidia.com/gpumem": "1000"});
    let cases = [
        (
            "wants-h100",
            json!({"nvidia.com/use-gputype": "H100"}),
            "h100",
        ),
        (
            "no-h100",
            json!({"nvidia.com/nouse-gputype": "h100"}),
            "a100",
        ),
        (
            "pinned",
            json!({"nvidia.com/use-gpuuuid": "GPU-h100-0"}),
            "h100",
        ),
        (
            "not-that-one",
            json!({"nvidia.com/nouse-gpuuuid": "GPU-h100-0"}),
            "a100",
        ),
    ];
    for (pod, annotations, _) in &cases {
        cluster
            .create_pod(pod, small.clone(), annotations.clone())
            .await;
    }
    for (pod, _, node) in cases {
        assert_eq!(cluster.node_of(pod).await, node, "{pod}");
    }
    cluster
        .create_pod("wants-t4", small, json!({"nvidia.com/use-gputype": "T4"}))
        .await;
    let joined = cluster.failed_scheduling("wants-t4").await.join("\n");
    assert!(
        joined.contains("1 GPU not of a type in nvidia.com/use-gputype"),
        "{joined}"
    );
}

#[tokio::test]
async fn a_burst_of_200_pods_binds_without_overcommit_or_leftover_locks() {
    use std::collections::HashMap;

    use kube::{Api, api::ListParams};
    use tessera_api::v1alpha1::{NodeLock, VgpuAllocation};

    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    for n in 0..20 {
        cluster
            .add_gpu_node(&format!("burst-{n:02}"), "NVIDIA A100-SXM4-80GB", 4, 81920)
            .await;
    }
    let started = std::time::Instant::now();
    for p in 0..200 {
        let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "25"});
        cluster
            .create_pod(&format!("burst-{p:03}"), limits, json!({}))
            .await;
    }
    for p in 0..200 {
        cluster.node_of(&format!("burst-{p:03}")).await;
    }
    eprintln!(
        "200 GPU pods bound in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // I1, folded from the API server's allocations (not from our ledger).
    let allocations = Api::<VgpuAllocation>::namespaced(cluster.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        allocations.items.len(),
        200,
        "every bound GPU pod has one allocation"
    );
    let mut per_device: HashMap<String, (u64, u32, u32)> = HashMap::new();
    for allocation in &allocations.items {
        for slice in allocation.spec.containers.iter().flat_map(|c| &c.devices) {
            let entry = per_device.entry(slice.uuid.clone()).or_default();
            entry.0 += slice.memory_mib;
            entry.1 += slice.cores;
            entry.2 += 1;
        }
    }
    for (uuid, (memory, cores, slices)) in &per_device {
        assert!(
            *memory <= 81920 && *cores <= 100 && *slices <= 10,
            "I1 broken on {uuid}: {memory} MiB, {cores} cores, {slices} slices"
        );
    }

    // No lock is left held once every pod is served.
    let locks: Api<NodeLock> = Api::all(cluster.client.clone());
    let allocations: Api<VgpuAllocation> = Api::all(cluster.client.clone());
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let existing = allocations
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let locks = locks.list(&ListParams::default()).await.unwrap().items;
        let held: Vec<_> = locks.iter().filter(|l| l.held_among(&existing)).collect();
        if held.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "NodeLocks left held: {held:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_webhook_routes_gpu_pods_and_refuses_invalid_requests() {
    use k8s_openapi::api::core::v1::Pod;

    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster
        .add_gpu_node("w1", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    let pod = |name: &str, limits: serde_json::Value| json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}});

    // A HAMi manifest, unchanged: no schedulerName, only gpumem.
    let created: Pod = cluster
        .create_raw_pod(pod("hami-style", json!({"nvidia.com/gpumem": "3000"})))
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("tessera-scheduler"));
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "1", "defaultGPUNum filled in");
    assert_eq!(cluster.node_of("hami-style").await, "w1");

    let plain: Pod = cluster
        .create_raw_pod(pod("plain", json!({"cpu": "100m"})))
        .await
        .unwrap();
    assert_eq!(
        plain.spec.unwrap().scheduler_name.as_deref(),
        Some("default-scheduler"),
        "pods without GPUs are untouched"
    );

    let cases = [
        (
            "both-memories",
            json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "10"}),
            "nvidia.com/gpumem: cannot be combined with nvidia.com/gpumem-percentage",
        ),
        (
            "too-many-cores",
            json!({"nvidia.com/gpucores": "101"}),
            "nvidia.com/gpucores: must be between 0 and 100, got 101",
        ),
        (
            "bigger-than-any-gpu",
            json!({"nvidia.com/gpumem": "100000"}),
            "100000 MiB is more than any GPU in the cluster offers (largest: 81920 MiB)",
        ),
    ];
    for (name, limits, needle) in cases {
        let error = cluster
            .create_raw_pod(pod(name, limits))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("admission webhook \"pods.tessera.dev\" denied the request")
                && error.contains(needle),
            "{name}: {error}"
        );
    }
    // The plain pod never reached the webhook (matchConditions).
    let metrics = cluster.metrics().await;
    for needle in [
        "tessera_webhook_requests_total{outcome=\"mutated\"} 1\n",
        "tessera_webhook_requests_total{outcome=\"denied\"} 3\n",
    ] {
        assert!(
            metrics.contains(needle),
            "metrics lack {needle}:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("tessera_webhook_requests_total{outcome=\"allowed\"} 0\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_containers_priority_is_recorded_for_the_node_agent() {
    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    cluster.add_gpu_node("prio-1", "Tesla T4", 1, 15360).await;
    cluster
        .create_pod(
            "urgent",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "30", "nvidia.com/priority": "0"}),
            json!({}),
        )
        .await;
    cluster
        .create_pod(
            "casual",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}),
            json!({}),
        )
        .await;
    cluster.node_of("urgent").await;
    cluster.node_of("casual").await;
    let priority = |a: tessera_api::v1alpha1::VgpuAllocation| a.spec.containers[0].priority;
    assert_eq!(priority(cluster.allocation("urgent").await), Some(0));
    assert_eq!(priority(cluster.allocation("casual").await), None);
}
