//! MPS on a real node (containerd + kubelet, the chart's agent) whose two
//! fake H100s are in `operatingMode: mps`:
//!
//! 1. the MPS host runs each GPU's MPS control daemon (the fake one, which
//!    answers NVIDIA's control commands on `<pipe dir>/control`) before any
//!    pod arrives;
//! 2. two pods with `nvidia.com/vgpu-mode: mps` share a GPU: each gets its
//!    daemon's pipe and log directories (read-only), its share as
//!    `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
//!    `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, the `/dev/shm` every MPS client
//!    and daemon shares (the node's tmpfs of `agent.mpsHost.shmSizeMiB`,
//!    which a tenant fills only to ENOSPC, never the node's disk), and no
//!    interposer;
//! 3. the agent's pod is replaced under the running MPS pods: the daemon,
//!    which the MPS host (the chart's `tessera-mps` DaemonSet) runs in a pod
//!    of its own, keeps its state and serves a pod placed afterwards;
//! 4. a pod asking for two GPUs in MPS mode stays Pending with the reason
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
use tessera_e2e::testkit::{self, gpu_pod, phase};
use tessera_e2e::{
    Lifetime,
    artifacts::Artifacts,
    cluster::{LocalCluster, NAMESPACE, NodeGpus},
    node::FakeGpu,
};

const WAIT: Duration = Duration::from_secs(120);
const NODE: &str = "mps-node";
/// `agent.mpsHost.shmSizeMiB`: the MPS clients' shared `/dev/shm`.
const SHM_MIB: u64 = 16;

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

/// One control command to the fake daemon through its socket on the host.
fn control(socket: &std::path::Path, line: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(format!("{line}\n").as_bytes()).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

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
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn mps_pods_share_the_gpus_daemon_with_their_share_as_client_settings() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let gpus = FakeGpu::many(NODE, 2, "NVIDIA H100 80GB HBM3", 81559, 2);
    let nodes = [NodeGpus {
        name: NODE.into(),
        gpus,
        ..Default::default()
    }];
    let defaults = json!({
        "nodeDefaults": {"operatingMode": "mps"},
        "agent": {"mpsHost": {"shmSizeMiB": SHM_MIB}},
    });
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
    // That /dev/shm is the node's tmpfs of agent.mpsHost.shmSizeMiB, which
    // the MPS host's init container mounted: a tenant filling it gets
    // ENOSPC, and nothing it writes reaches the node's disk.
    let mounts = cluster.nodes[0].mounts().unwrap();
    let shm_mount = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/var/lib/tessera/mps/shm"))
        .unwrap_or_else(|| panic!("no mount at the MPS /dev/shm:\n{mounts}"));
    assert!(shm_mount.contains(" - tmpfs "), "{shm_mount}");
    assert!(
        shm_mount.contains(&format!("size={}k", SHM_MIB * 1024)),
        "{shm_mount}"
    );
    let fill = cluster
        .plane
        .kubectl()
        .unwrap()
        .args(["exec", "mps-b", "--", "sh", "-c"])
        .arg(format!(
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count={} 2>&1; echo BYTES=$(wc -c < /dev/shm/fill)",
            SHM_MIB * 4
        ))
        .output()
        .unwrap();
    let fill = String::from_utf8_lossy(&fill.stdout);
    assert!(fill.contains("No space left on device"), "{fill}");
    let bytes: u64 = fill
        .lines()
        .find_map(|l| l.strip_prefix("BYTES="))
        .and_then(|b| b.trim().parse().ok())
        .unwrap_or_else(|| panic!("{fill}"));
    assert!(
        bytes <= SHM_MIB << 20,
        "{bytes} bytes in a {SHM_MIB} MiB tmpfs"
    );
    let on_disk = cluster.nodes[0].dir().join("agent/mps/shm");
    assert!(
        !on_disk.join("fill").exists() && !on_disk.join("from-mps-a").exists(),
        "MPS clients wrote to the node's disk at {}",
        on_disk.display()
    );
    let gone = cluster
        .plane
        .kubectl()
        .unwrap()
        .args(["exec", "mps-b", "--", "rm", "/dev/shm/fill"])
        .status()
        .unwrap();
    assert!(gone.success());

    // 3. The agent's pod is replaced (a restart or an upgrade): the daemon,
    // which the MPS host runs in its own pod, keeps serving its clients.
    let gpu = visible[0].clone();
    let root = cluster.nodes[0].dir().join("agent/mps").join(&gpu);
    let ask = |line: &str| control(&root.join("pipe/control"), line);
    // State only this daemon process holds: a restarted one would say 100.
    ask("set_default_active_thread_percentage 40");
    let old_agent = cluster.agent_pod(NODE).await.unwrap();
    let agents: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    agents
        .delete(
            &old_agent.metadata.name.clone().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    testkit::wait_for("a new agent pod to be Ready", WAIT, async || {
        let pod = cluster.agent_pod(NODE).await.ok()?;
        (pod.metadata.uid != old_agent.metadata.uid && testkit::pod_ready(&pod)).then_some(())
    })
    .await;
    assert_eq!(
        ask("get_default_active_thread_percentage"),
        "40.0\n",
        "the daemon the clients use outlived the agent"
    );
    let log = std::fs::read_to_string(root.join("log/control.log")).unwrap();
    assert_eq!(log.matches("Control daemon started").count(), 1, "{log}");
    assert!(!log.contains("Control daemon exited"), "{log}");
    // A pod placed after the restart joins the same daemon.
    pods.create(&PostParams::default(), &mps_pod("mps-c", 1, 4000, 10))
        .await
        .unwrap();
    let out = testkit::wait_for("mps-c to print its settings", WAIT, async || {
        let out = cluster.plane.logs("default", "mps-c").ok()?;
        out.contains("END").then_some(out)
    })
    .await;
    assert!(
        out.contains(&format!("NVIDIA_VISIBLE_DEVICES={gpu}")),
        "{out}"
    );
    assert!(out.contains("SOCKET=yes"), "{out}");
    assert_eq!(out.matches("Control daemon started").count(), 1, "{out}");

    // 4. Two GPUs in MPS mode: Pending, with the reason.
    pods.create(&PostParams::default(), &mps_pod("mps-two", 2, 1000, 10))
        .await
        .unwrap();
    let reason = testkit::wait_for("mps-two's FailedScheduling event", WAIT, async || {
        testkit::scheduling_failure(&client, "default", "mps-two").await
    })
    .await;
    assert!(reason.contains("MPS"), "{reason}");
    assert_eq!(phase(&pods.get("mps-two").await.unwrap()), "Pending");
    for name in ["mps-a", "mps-b", "mps-c", "mps-two"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
}
