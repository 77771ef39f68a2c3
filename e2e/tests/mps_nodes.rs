//! MPS on a real node (containerd + kubelet, the chart's agent) whose two
//! fake H100s are in `operatingMode: mps`:
//!
//! 1. the agent runs each GPU's MPS control daemon (the fake one, which
//!    answers NVIDIA's control commands on `<pipe dir>/control`) before any
//!    pod arrives;
//! 2. two pods with `nvidia.com/vgpu-mode: mps` share a GPU: each gets its
//!    daemon's pipe and log directories (read-only), its share as
//!    `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
//!    `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, the `/dev/shm` every MPS client
//!    and daemon shares, and no interposer;
//! 3. a pod asking for two GPUs in MPS mode stays Pending with the reason
//!    (one daemon per GPU, so one GPU per MPS container).
//!
//! Needs what the real-node tests need; `TESSERA_SKIP_REAL_NODES=1` skips it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use tessera_api::v1alpha1::{GpuNode, OperatingMode};
use tessera_e2e::testkit::{self, gpu_pod, phase, skip_real_nodes};
use tessera_e2e::{
    Lifetime,
    artifacts::Artifacts,
    cluster::{LocalCluster, NodeGpus},
    node::FakeGpu,
};

const WAIT: Duration = Duration::from_secs(120);
const NODE: &str = "mps-node";

/// What the container prints: its MPS settings, whether the daemon's
/// socket is there, whether it can write the pipe directory, the
/// daemon's log and any preload.
const SCRIPT: &str = r#"env | grep -E '^(CUDA_MPS_|NVIDIA_VISIBLE_DEVICES|CUDA_DEVICE_)' | sort
test -S "$CUDA_MPS_PIPE_DIRECTORY/control" && echo SOCKET=yes
touch "$CUDA_MPS_PIPE_DIRECTORY/planted" 2>/dev/null && echo WRITABLE=yes
touch "/dev/shm/from-$HOSTNAME" && echo SHM=yes
sed 's/^/LOG=/' "$CUDA_MPS_LOG_DIRECTORY/control.log"
cat /etc/ld.so.preload 2>/dev/null | sed 's/^/PRELOAD=/'
echo END; sleep 3600"#;

fn mps_pod(name: &str, gpus: u32, memory: u64, cores: u32) -> Pod {
    let mut pod = gpu_pod(name, memory, Some(cores), SCRIPT);
    pod["metadata"]["annotations"] = json!({
        "nvidia.com/vgpu-mode": "mps",
        "hami.io/gpu-scheduler-policy": "binpack",
    });
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(gpus);
    serde_json::from_value(pod).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn mps_pods_share_the_gpus_daemon_with_their_share_as_client_settings() {
    if skip_real_nodes("real-node MPS test") {
        return;
    }
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let gpus = FakeGpu::many(NODE, 2, "NVIDIA H100 80GB HBM3", 81559, 2);
    let nodes = [NodeGpus {
        name: NODE.into(),
        gpus,
        ..Default::default()
    }];
    let defaults = json!({"nodeDefaults": {"operatingMode": "mps"}});
    let cluster = LocalCluster::start_with(None, Lifetime::Tied, &nodes, &artifacts, defaults)
        .await
        .unwrap();
    let client = cluster.plane.client().await.unwrap();
    testkit::wait_for(
        "the GpuNode to offer the GPU in MPS mode",
        WAIT,
        async || {
            let node = Api::<GpuNode>::all(client.clone()).get(NODE).await.ok()?;
            let devices = node.status?.devices;
            (devices.len() == 2 && devices.iter().all(|d| d.mode == OperatingMode::Mps))
                .then_some(())
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // 2. Two pods share one GPU (binpack), each with its own share.
    for (name, memory, cores) in [("mps-a", 8000, 30), ("mps-b", 20000, 50)] {
        pods.create(&PostParams::default(), &mps_pod(name, 1, memory, cores))
            .await
            .unwrap();
    }
    let mut visible = Vec::new();
    for (name, memory, cores) in [("mps-a", 8000, 30), ("mps-b", 20000, 50)] {
        let out = testkit::wait_for(&format!("{name} to print its settings"), WAIT, async || {
            let out = cluster.plane.logs("default", name).ok()?;
            out.contains("END").then_some(out)
        })
        .await;
        for line in [
            format!("NVIDIA_VISIBLE_DEVICES=GPU-{NODE}-"),
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_owned(),
            "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps".to_owned(),
            format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={cores}"),
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory}M"),
            "SOCKET=yes".to_owned(),
            "SHM=yes".to_owned(),
            "LOG=".to_owned(),
        ] {
            assert!(out.contains(&line), "{name}: no {line:?} in\n{out}");
        }
        // 1. The daemon was started once, before the pods came.
        assert_eq!(
            out.matches("Control daemon started").count(),
            1,
            "{name}:\n{out}"
        );
        assert!(!out.contains("WRITABLE=yes"), "{name}: {out}");
        assert!(!out.contains("PRELOAD="), "{name}: no interposer: {out}");
        assert!(
            !out.contains("CUDA_DEVICE_"),
            "{name}: no interposer limits: {out}"
        );
        visible.extend(
            out.lines()
                .filter_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
                .map(str::to_owned),
        );
    }
    assert_eq!(visible.len(), 2);
    assert_eq!(visible[0], visible[1], "binpack puts both on one GPU");
    // One /dev/shm for both: each sees what the other wrote there.
    let shm = cluster
        .plane
        .kubectl()
        .unwrap()
        .args(["exec", "mps-a", "--", "ls", "/dev/shm"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&shm.stdout);
    assert!(
        listed.contains("from-mps-a") && listed.contains("from-mps-b"),
        "{listed}"
    );

    // 3. Two GPUs in MPS mode: Pending, with the reason.
    pods.create(&PostParams::default(), &mps_pod("mps-two", 2, 1000, 10))
        .await
        .unwrap();
    let reason = testkit::wait_for("mps-two's FailedScheduling event", WAIT, async || {
        testkit::scheduling_failure(&client, "default", "mps-two").await
    })
    .await;
    assert!(reason.contains("MPS"), "{reason}");
    assert_eq!(phase(&pods.get("mps-two").await.unwrap()), "Pending");
    for name in ["mps-a", "mps-b", "mps-two"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
}
