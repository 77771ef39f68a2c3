//! The install smoke test on the oldest Kubernetes docs/install.md claims
//! (v1.30, built by `hack/tools.sh` into `<bin>/oldest`): its API server,
//! scheduler, controller manager, kubelet and kube-proxy, containerd 2 and
//! the chart installed with `helm install`, as on the current version.
//!
//! v1.30 serves no `resource.k8s.io/v1`: the chart creates no DeviceClass,
//! the agent starts nothing of DRA and keeps its node on the device plugin
//! (a failed ResourceClaim list once read as a DRA holder and switched a
//! fresh node off for good), and a GPU pod gets its slice, enforced in its
//! container. The rest of the suite runs on the current version only.
//!
//! Needs what the real-node tests need; `TESSERA_SKIP_REAL_NODES=1` skips it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams, core::DynamicObject, discovery::ApiResource};
use tessera_api::v1alpha1::{FrontDoor, GpuNode};
use tessera_e2e::{
    Lifetime,
    artifacts::Artifacts,
    cluster::{LocalCluster, NodeGpus},
    node::FakeGpu,
    testkit::{self, gpu_pod, number, section, wait_for},
    tools,
};

const LIMIT: Duration = Duration::from_secs(180);
const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn the_chart_serves_a_gpu_pod_on_the_oldest_kubernetes_the_docs_claim() {
    let version = tools::use_oldest_kubernetes().unwrap();
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let nodes = [NodeGpus {
        name: "old-node".into(),
        gpus: FakeGpu::many("old-node", 1, "NVIDIA L4", 23034, 1),
        ..Default::default()
    }];
    let cluster = LocalCluster::start(None, Lifetime::Tied, &nodes, &artifacts)
        .await
        .unwrap();
    let client = cluster.plane.client().await.unwrap();
    let served = client.apiserver_version().await.unwrap();
    assert_eq!(
        format!("v{}.{}", served.major, served.minor),
        version.rsplit_once('.').unwrap().0,
        "the cluster runs {version}: {served:?}"
    );

    // No DRA here: the node serves its GPU through the device plugin, Ready.
    let gpu_node = wait_for("old-node's GpuNode Ready", LIMIT, async || {
        let g = Api::<GpuNode>::all(client.clone())
            .get_opt("old-node")
            .await
            .ok()??;
        let status = g.status.clone()?;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(g)
    })
    .await;
    let status = gpu_node.status.unwrap();
    assert_eq!(status.front_door, FrontDoor::DevicePlugin, "{status:?}");
    assert_eq!(status.gpu_count, 1);
    let device_classes = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("resource.k8s.io", "v1", "DeviceClass"),
            "deviceclasses",
        ),
    );
    assert!(
        device_classes.list(&Default::default()).await.is_err(),
        "v1.30 serves no resource.k8s.io/v1"
    );

    // A GPU pod gets its slice; the interposer enforces it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(gpu_pod(
        "sliced",
        1024,
        Some(30),
        "echo '--- meminfo'; cuda-probe meminfo 0; echo '--- end'; sleep 3600",
    ))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let out = wait_for("sliced to print its probe", LIMIT, async || {
        let out = cluster.plane.logs("default", "sliced").ok()?;
        out.contains("--- end").then_some(out)
    })
    .await;
    assert_eq!(
        number(&section(&out, "--- meminfo"), "total"),
        1024 * MIB,
        "{out}"
    );
    let allocation = testkit::allocated(&client, "default", "sliced", LIMIT).await;
    assert_eq!(allocation.spec.node_name, "old-node");
}
