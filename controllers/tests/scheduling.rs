//! End-to-end scheduling with a real kube-scheduler calling Tessera's
//! extender: placements, reasons in FailedScheduling events, policies.
//!
//! No node agent exists yet: `spawn_allocate_stand_in` plays its Allocate
//! step (allocation Allocated, lock released) so locks do not pile up.

mod support;

use serde_json::json;
use support::{Cluster, spawn_allocate_stand_in};
use tessera_api::v1alpha1::AllocationPhase;
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
    cluster.add_gpu_node("small-1", "Tesla T4", 2, 15360).await;
    cluster
        .create_pod(
            "huge",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000"}),
            json!({}),
        )
        .await;
    let messages = cluster.failed_scheduling("huge").await;
    let joined = messages.join("\n");
    assert!(
        joined
            .contains("container \"main\" needs 1 GPU with 40000 MiB and 0 cores; 0 of 2 GPUs fit"),
        "{joined}"
    );
    assert!(
        joined.contains("largest free is 15360 MiB on GPU-small-1-"),
        "{joined}"
    );
}
