//! The agent's objects and the Node's life (issue 12 D, issue 11): an agent
//! started before the kubelet registered its Node creates its GpuNode and
//! Lease without an owner, and gives them the Node as owner once it exists,
//! so deleting the Node (the garbage collector of a real
//! kube-controller-manager) deletes them; an agent stopped cleanly deletes
//! its Lease; an agent running in a pod in the Lease's namespace has the pod
//! own the Lease, so the Lease goes with the pod even when the agent could
//! not delete it (killed, or refused because helm uninstall removed its
//! RBAC first).

use std::time::Duration;

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
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
    tessera_testkit::eventually(what, WAIT, check).await
}

fn start_agent(plane: &ControlPlane, dir: &std::path::Path, node: &str) -> Process {
    start_agent_with(plane, dir, node, &[])
}

fn start_agent_with(
    plane: &ControlPlane,
    dir: &std::path::Path,
    node: &str,
    extra: &[&str],
) -> Process {
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
        "--kubelet-plugins-dir",
        &dir.join("plugins").display().to_string(),
        "--plugins-registry-dir",
        &dir.join("plugins_registry").display().to_string(),
        "--cdi-dir",
        &dir.join("cdi").display().to_string(),
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
    .chain(extra)
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

#[tokio::test]
async fn an_agent_in_a_pod_has_the_pod_own_its_lease_so_it_goes_with_the_pod() {
    let plane = ControlPlane::start().await.expect("control plane");
    plane
        .start_controller_manager()
        .await
        .expect("kube-controller-manager");
    let client = plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The agent's pod as the API server knows it (never scheduled here:
    // only its identity matters for ownership).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "tessera-node-agent-x1"},
        "spec": {"containers": [{"name": "node-agent", "image": "tessera-node-agent"}]},
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod_uid = pod.metadata.uid.clone().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "pod-node"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    let mut agent = start_agent_with(
        &plane,
        dir.path(),
        "pod-node",
        &[
            "--pod-name",
            "tessera-node-agent-x1",
            "--pod-namespace",
            "default",
            "--pod-uid",
            &pod_uid,
        ],
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let gpu_nodes: Api<GpuNode> = Api::all(client.clone());
    eventually("the Lease is created, owned by the pod alone", async || {
        leases
            .get_opt("tessera-agent-pod-node")
            .await
            .unwrap()
            .is_some_and(|lease| {
                matches!(lease.owner_references(), [o] if o.kind == "Pod" && o.uid == pod_uid)
            })
    })
    .await;
    eventually("the GpuNode is still owned by the Node", async || {
        gpu_nodes
            .get_opt("pod-node")
            .await
            .unwrap()
            .is_some_and(|g| matches!(g.owner_references(), [o] if o.kind == "Node"))
    })
    .await;

    // Killed: no clean stop, the Lease stays...
    agent.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        leases
            .get_opt("tessera-agent-pod-node")
            .await
            .unwrap()
            .is_some()
    );
    // ...until its pod goes.
    pods.delete("tessera-node-agent-x1", &DeleteParams::default())
        .await
        .unwrap();
    let took = eventually("the Lease goes with the agent's pod", async || {
        leases
            .get_opt("tessera-agent-pod-node")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    println!("agent pod deleted → Lease deleted: {} ms", took.as_millis());
}
