//! kube-scheduler and kube-controller-manager started by the harness do their
//! jobs against the local control plane: the scheduler binds a pod, the
//! controller manager's garbage collector deletes a VgpuAllocation whose pod is gone.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
    runtime::wait::{await_condition, conditions},
};
use serde_json::json;
use tessera_api::{testing, v1alpha1::VgpuAllocation};
use tessera_e2e::ControlPlane;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn scheduler_binds_and_controller_manager_collects_garbage() {
    let cluster = ControlPlane::start().await.unwrap();
    cluster
        .start_scheduler("profiles:\n- schedulerName: default-scheduler\n")
        .await
        .unwrap();
    cluster.start_controller_manager().await.unwrap();
    let client = cluster.client().await.unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    let node = serde_json::from_value(json!({
        "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}],
        },
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "bound"},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let scheduled = await_condition(pods.clone(), "bound", |pod: Option<&Pod>| {
        pod.and_then(|p| p.spec.as_ref()?.node_name.as_deref()) == Some("node-1")
    });
    tokio::time::timeout(WAIT, scheduled)
        .await
        .expect("the scheduler binds the pod")
        .unwrap();

    // An allocation owned by a pod goes away with the pod.
    let owner = serde_json::from_value(json!({
        "metadata": {"name": "owner"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "example.invalid/none"}]},
    }))
    .unwrap();
    let owner = pods.create(&PostParams::default(), &owner).await.unwrap();
    let uid = owner.metadata.uid.clone().unwrap();
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), "default");
    let allocation = testing::allocation("owner", &uid, "node-1")
        .container(testing::container(
            "c",
            vec![testing::slice("GPU-1", 0, 1000, 10)],
        ))
        .metadata(|m| {
            m.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: "owner".into(),
                uid: uid.clone(),
                ..Default::default()
            }]);
        })
        .build();
    allocations
        .create(&PostParams::default(), &allocation)
        .await
        .unwrap();
    // No kubelet runs, so delete the pod at once instead of gracefully.
    pods.delete("owner", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let collected = await_condition(allocations, "owner", conditions::is_deleted(""));
    tokio::time::timeout(WAIT, collected)
        .await
        .expect("the garbage collector deletes the allocation")
        .unwrap();
}
