//! The agent's objects and the Node's life (issue 12 D, issue 11): an agent
//! started before the kubelet registered its Node creates its GpuNode and
//! Lease without an owner, and gives them the Node as owner once it exists,
//! so deleting the Node (the garbage collector of a real
//! kube-controller-manager) deletes them; an agent stopped cleanly deletes
//! its Lease.

use std::time::{Duration, Instant};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use tessera_api::v1alpha1::GpuNode;
use tessera_e2e::{
    ControlPlane,
    process::{Lifetime, Process},
};

const WAIT: Duration = Duration::from_secs(30);

async fn eventually<F: AsyncFn() -> bool>(what: &str, check: F) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < WAIT, "not within {WAIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

fn start_agent(plane: &ControlPlane, dir: &std::path::Path, node: &str) -> Process {
    std::fs::write(
        dir.join("gpus.yaml"),
        "devices:\n- {uuid: GPU-o-0, index: 0, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, health: Healthy}\n",
    )
    .unwrap();
    let args: Vec<String> = [
        "--kubeconfig",
        &plane.kubeconfig().display().to_string(),
        "--node-name",
        node,
        "--backend",
        "fake",
        "--fake-gpus-file",
        &dir.join("gpus.yaml").display().to_string(),
        "--device-plugin-dir",
        &dir.join("device-plugins").display().to_string(),
        "--state-dir",
        &dir.join("state").display().to_string(),
        "--lease-namespace",
        "default",
        "--metrics-addr",
        "127.0.0.1:0",
        "--drain-seconds",
        "2",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    std::fs::create_dir_all(dir.join("device-plugins")).unwrap();
    Process::spawn(
        "tessera-node-agent",
        std::path::Path::new(env!("CARGO_BIN_EXE_tessera-node-agent")),
        &args,
        dir.join("agent.log"),
        Lifetime::Tied,
    )
    .unwrap()
}

#[tokio::test]
async fn the_node_owns_what_its_agent_made_before_it_registered_and_a_clean_stop_deletes_the_lease()
{
    let plane = ControlPlane::start().await.expect("control plane");
    plane
        .start_controller_manager()
        .await
        .expect("kube-controller-manager");
    let client = plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&plane, dir.path(), "late-node");
    let gpu_nodes: Api<GpuNode> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let log = || tessera_e2e::process::log_tail(&dir.path().join("agent.log"), 30);

    eventually("the agent creates its GpuNode and Lease", async || {
        gpu_nodes.get_opt("late-node").await.unwrap().is_some()
            && leases
                .get_opt("tessera-agent-late-node")
                .await
                .unwrap()
                .is_some()
    })
    .await;
    let gpu_node = gpu_nodes.get("late-node").await.unwrap();
    assert!(
        gpu_node.owner_references().is_empty(),
        "no Node yet, no owner"
    );

    // The kubelet registers the Node.
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "late-node"}})).unwrap();
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    let uid = node.metadata.uid.clone().unwrap();
    let owned_by_node =
        |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            refs.iter().any(|o| o.kind == "Node" && o.uid == uid)
        };
    let took = eventually(
        "the GpuNode and the Lease are owned by the Node",
        async || {
            let gpu_node = gpu_nodes.get("late-node").await.unwrap();
            let lease = leases.get("tessera-agent-late-node").await.unwrap();
            owned_by_node(gpu_node.owner_references()) && owned_by_node(lease.owner_references())
        },
    )
    .await;
    println!(
        "Node registered → GpuNode and Lease owned: {} ms",
        took.as_millis()
    );

    // A clean stop (SIGTERM) deletes the Lease.
    agent.stop();
    assert!(
        leases
            .get_opt("tessera-agent-late-node")
            .await
            .unwrap()
            .is_none(),
        "the Lease outlived a clean stop; agent log:\n{}",
        log()
    );

    // Deleting the Node deletes its GpuNode.
    nodes
        .delete("late-node", &DeleteParams::default())
        .await
        .unwrap();
    let took = eventually("the GpuNode goes with its Node", async || {
        gpu_nodes.get_opt("late-node").await.unwrap().is_none()
    })
    .await;
    println!("Node deleted → GpuNode deleted: {} ms", took.as_millis());
}
