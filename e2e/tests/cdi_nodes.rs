//! CDI on the real nodes' containerd 2 (the tool cache's, which the DRA front
//! door needs): with the agent's `cdi-cri` device-list strategy, Allocate
//! names the GPU as the CDI device `nvidia.com/gpu=<uuid>`, and containerd
//! applies that device's edits from the node's CDI spec directory, as it
//! would a spec `nvidia-ctk cdi generate` wrote.
//!
//! Needs what the real-node tests need; `TESSERA_SKIP_REAL_NODES=1` skips it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use serde_json::json;
use tessera_e2e::testkit::{self, gpu_pod, one_gpu_node};

const NODE: &str = "cdi-node";

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn containerd_applies_the_cdi_device_allocate_names() {
    let (mut cluster, uuid) = one_gpu_node(NODE, "NVIDIA H100 80GB HBM3", 81559).await;
    // The node's CDI spec for its GPU, as nvidia-ctk would write it.
    let spec = json!({
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": uuid, "containerEdits": {"env": [format!("CDI_GPU={uuid}")]}}],
    });
    let dir = cluster.nodes[0].dir().join("cdi");
    std::fs::write(dir.join("nvidia.json"), spec.to_string()).unwrap();
    cluster
        .helm_install(&["--set", "agent.deviceListStrategy={envvar,cdi-cri}"])
        .await
        .unwrap();

    let client = cluster.plane.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod = gpu_pod("cdi", 1000, None, "echo CDI=$CDI_GPU; echo END; sleep 3600");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let out = testkit::wait_for(
        "the pod to print its CDI edits",
        Duration::from_secs(120),
        async || {
            let out = cluster.plane.logs("default", "cdi").ok()?;
            out.contains("END").then_some(out)
        },
    )
    .await;
    assert!(out.contains(&format!("CDI={uuid}")), "{out}");
}
