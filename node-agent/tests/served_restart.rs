//! Which container a restarted agent serves: the kubelet's Allocate names
//! no container, and the allocation's `servedContainers` is written after
//! the answer. A real API server behind the agent's device-plugin service,
//! called directly (no socket), with the status writes of the first
//! service refused as if the agent died before them.

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
    client::ClientBuilder,
};
use serde_json::json;
use tessera_api::{testing, v1alpha1::NodeLock};
use tessera_deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    device_plugin_server::DevicePlugin,
};
use tessera_node_agent::plugin::{self, Service};

mod fake_service;

/// A client whose status writes to VgpuAllocations never land: each goes
/// to a name that does not exist (404), as if the agent was killed before
/// it wrote.
async fn no_status_writes(plane: &tessera_e2e::ControlPlane) -> Client {
    let config = plane.client_config().await.unwrap();
    let layer =
        tower::util::MapRequestLayer::new(|mut request: http::Request<kube::client::Body>| {
            let path = request.uri().path().to_owned();
            if request.method() == http::Method::PATCH
                && path.contains("/vgpuallocations/")
                && path.ends_with("/status")
            {
                let blocked = path.replace("/status", "-never-written/status");
                let query = request
                    .uri()
                    .query()
                    .map(|q| format!("?{q}"))
                    .unwrap_or_default();
                *request.uri_mut() = format!("{blocked}{query}").parse().unwrap();
            }
            request
        });
    ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build()
}

/// The agent's device-plugin service for `node`, with its state in `dir`.
async fn service(client: Client, node: &str, dir: &std::path::Path) -> Service {
    let gpus = dir.join("gpus.yaml");
    std::fs::write(
        &gpus,
        format!(
            "devices:\n- {{uuid: GPU-{node}-0, index: 0, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920}}\n"
        ),
    )
    .unwrap();
    fake_service::service(client, node, dir, &gpus, &dir.join("state")).await
}

/// A pod `name` bound to `node` with two GPU containers, `c1` (3000 MiB)
/// and `c2` (1000 MiB) on the node's GPU, its allocation (Bound) and the
/// node's lock naming it; returns the pod's UID.
async fn locked_pod(client: &Client, node: &str, name: &str) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "c1", "image": "example.invalid/cuda"},
                {"name": "c2", "image": "example.invalid/cuda"},
            ],
        },
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let gpu = format!("GPU-{node}-0");
    let allocation = testing::allocation(name, &uid, node)
        .container(testing::container(
            "c1",
            vec![testing::slice(&gpu, 0, 3000, 30)],
        ))
        .container(testing::container(
            "c2",
            vec![testing::slice(&gpu, 0, 1000, 10)],
        ))
        .build();
    Api::<tessera_api::v1alpha1::VgpuAllocation>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &allocation)
        .await
        .unwrap();
    let locks = Api::<NodeLock>::all(client.clone());
    let _ = locks.delete(node, &DeleteParams::default()).await;
    let now = k8s_openapi::jiff::Timestamp::now();
    let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap();
    let lock = testing::node_lock(node, testing::pod_ref("default", name, &uid), name, now, 60);
    locks.create(&PostParams::default(), &lock).await.unwrap();
    uid
}

/// Allocate for one container with the node's GPU.
async fn allocate(
    service: &Service,
    node: &str,
) -> Result<ContainerAllocateResponse, tonic::Status> {
    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec![format!("GPU-{node}-0::0")],
        }],
    };
    let mut answer = service
        .allocate(tonic::Request::new(request))
        .await?
        .into_inner();
    Ok(answer.container_responses.remove(0))
}

/// The region directory (host path) a container was given.
fn region(answer: &ContainerAllocateResponse) -> String {
    answer
        .mounts
        .iter()
        .find(|m| m.container_path == plugin::CONTAINER_REGION_DIR)
        .map(|m| m.host_path.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_restarted_agent_serves_the_next_container_not_the_one_it_answered() {
    let plane = tessera_e2e::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let node = "served-restart";
    let dir = tempfile::tempdir().unwrap();
    let uid = locked_pod(&client, node, "two-gpu").await;

    let first = service(no_status_writes(plane).await, node, dir.path()).await;
    let c1 = allocate(&first, node).await.unwrap();
    assert_eq!(c1.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "3000m");
    assert!(
        region(&c1).ends_with(&format!("{uid}_c1")),
        "{}",
        region(&c1)
    );
    // The agent dies before its status write.
    drop(first);
    let allocation =
        Api::<tessera_api::v1alpha1::VgpuAllocation>::namespaced(client.clone(), "default")
            .get("two-gpu")
            .await
            .unwrap();
    assert!(
        allocation
            .status
            .as_ref()
            .is_none_or(|s| s.served_containers.is_empty()),
        "the status write did not land: {:?}",
        allocation.status
    );

    // The restarted agent serves c2, not c1 again.
    let second = service(client.clone(), node, dir.path()).await;
    let c2 = allocate(&second, node).await.unwrap();
    assert_eq!(
        c2.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m",
        "c2's limit, not c1's: {:?}",
        c2.envs
    );
    assert!(
        region(&c2).ends_with(&format!("{uid}_c2")),
        "{}",
        region(&c2)
    );
    assert_ne!(region(&c1), region(&c2), "c2 does not share c1's region");
}

#[tokio::test]
async fn a_restarted_agent_whose_record_is_unusable_refuses_rather_than_guesses() {
    let plane = tessera_e2e::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let node = "served-unusable";
    let dir = tempfile::tempdir().unwrap();
    locked_pod(&client, node, "two-gpu-lost").await;

    let first = service(no_status_writes(plane).await, node, dir.path()).await;
    let c1 = allocate(&first, node).await.unwrap();
    assert_eq!(c1.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "3000m");
    drop(first);
    // The record is damaged while the agent is down.
    std::fs::write(
        dir.path().join("state").join(plugin::served::FILE_NAME),
        b"{\"version\":1,\"pods\":[",
    )
    .unwrap();

    let second = service(client.clone(), node, dir.path()).await;
    let refused = allocate(&second, node).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    for needle in ["default/two-gpu-lost", "cannot tell which", "2 containers"] {
        assert!(
            refused.message().contains(needle),
            "{needle} not in {}",
            refused.message()
        );
    }
}
