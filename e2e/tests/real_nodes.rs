//! End to end on real nodes: kube-apiserver, etcd, kube-scheduler with the
//! extender, kube-controller-manager, the `tessera-controller` binary, and
//! two nodes each running containerd, a kubelet v1.36 and the node agent with
//! fake GPUs. Pods run in real containers from locally built images; inside
//! them the interposer (mounted by the agent's Allocate answer and preloaded)
//! enforces the slice against the fake CUDA driver.
//!
//! Needs root, containerd, runc, the CNI plugins and busybox-static (`.ci/run`
//! installs them). Set `TESSERA_SKIP_REAL_NODES=1` to skip these tests on a
//! machine without them; they are never skipped silently.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tessera_api::v1alpha1::{AllocationPhase, NodeLock, VgpuAllocation};
use tessera_e2e::artifacts::Artifacts;
use tessera_e2e::node::{FakeGpu, NodeSpec, RealNode};
use tessera_e2e::stack::Tessera;
use tessera_e2e::{ControlPlane, images};

const WAIT: Duration = Duration::from_secs(90);
const MIB: u64 = 1 << 20;

/// Nodes are declared first: they are torn down before the control plane.
struct Stack {
    nodes: Vec<RealNode>,
    tessera: Tessera,
    client: Client,
    plane: ControlPlane,
}

fn skip() -> bool {
    if std::env::var_os("TESSERA_SKIP_REAL_NODES").is_some() {
        eprintln!("TESSERA_SKIP_REAL_NODES is set: real-node test skipped");
        return true;
    }
    false
}

impl Stack {
    async fn start(nodes: &[(&str, usize)]) -> Self {
        tessera_e2e::remove_stale_dirs();
        let artifacts = Artifacts::locate().unwrap();
        let plane = ControlPlane::start().await.unwrap();
        let client = plane.client().await.unwrap();
        let archives = images::build(&plane.dir().join("images"), &artifacts).unwrap();
        let tessera = Tessera::deploy(&plane, &artifacts).await.unwrap();
        let mut started = Vec::new();
        for (index, (name, gpus)) in nodes.iter().enumerate() {
            let spec = NodeSpec {
                name: (*name).to_owned(),
                gpus: FakeGpu::many(name, *gpus, "NVIDIA A100-SXM4-80GB", 81920, 2),
                labels: BTreeMap::from([("gpu".to_owned(), "on".to_owned())]),
            };
            let node = RealNode::start(&plane, &spec, index as u8 + 1, &artifacts, &archives)
                .await
                .unwrap();
            started.push(node);
        }
        Self {
            nodes: started,
            tessera,
            client,
            plane,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, pod: Value) -> Pod {
        self.pods()
            .create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap()
    }

    /// Waits until `check` accepts the pod, failing with its last state.
    async fn wait_pod(&self, name: &str, what: &str, check: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + WAIT;
        loop {
            let pod = self.pods().get_opt(name).await.unwrap();
            if let Some(pod) = &pod
                && check(pod)
            {
                return pod.clone();
            }
            assert!(
                Instant::now() < deadline,
                "pod {name} never became {what}: {:#?}",
                pod.and_then(|p| p.status)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn wait_running(&self, name: &str) -> Pod {
        self.wait_pod(name, "Running", |p| phase(p) == "Running")
            .await
    }

    /// The container's output, through the API server and the kubelet.
    fn logs(&self, pod: &str) -> String {
        let output = self
            .plane
            .kubectl()
            .unwrap()
            .args(["logs", "-n", "default", pod])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "kubectl logs {pod}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits until the container printed `marker` and returns its output.
    async fn wait_output(&self, pod: &str, marker: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let out = self.logs(pod);
            if out.contains(marker) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "{pod} never printed {marker}:\n{out}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// A GPU pod running `script` in the CUDA demo image.
fn gpu_pod(name: &str, mem_mib: u64, cores: u32, script: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "cuda", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "resources": {"limits": {
                    "nvidia.com/gpu": 1, "nvidia.com/gpumem": mem_mib, "nvidia.com/gpucores": cores,
                }},
            }],
        },
    })
}

/// `key=value` lines after the line `section`, up to the next `---` line.
fn values(output: &str, section: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .skip_while(|l| *l != section)
        .skip(1)
        .take_while(|l| !l.starts_with("---"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn number(map: &BTreeMap<String, String>, key: &str) -> u64 {
    map.get(key)
        .unwrap_or_else(|| panic!("no {key} in {map:?}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_gets_its_slice_and_the_interposer_enforces_it_in_a_real_container() {
    if skip() {
        return;
    }
    let stack = Stack::start(&[("node-a", 2)]).await;
    const CHUNK: u64 = 64 * MIB;
    let script = format!(
        "echo '--- env'; env; echo '--- mounts'; cat /proc/mounts; \
         echo '--- meminfo'; cuda-probe meminfo 0; \
         echo '--- alloc'; cuda-probe alloc plain {CHUNK} 1000; echo '--- end'; sleep 3600"
    );
    stack.create(gpu_pod("slice", 1024, 30, &script)).await;
    stack.wait_running("slice").await;
    let out = stack.wait_output("slice", "--- end").await;

    let env = values(&out, "--- env");
    let allocation: VgpuAllocation = Api::namespaced(stack.client.clone(), "default")
        .get("slice")
        .await
        .unwrap();
    let uuid = &allocation.spec.containers[0].devices[0].uuid;
    assert_eq!(env.get("NVIDIA_VISIBLE_DEVICES"), Some(uuid), "{out}");
    assert_eq!(
        env.get("CUDA_DEVICE_MEMORY_LIMIT_0").map(String::as_str),
        Some("1024m")
    );
    assert_eq!(
        env.get("CUDA_DEVICE_SM_LIMIT").map(String::as_str),
        Some("30")
    );
    let region = env
        .get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .expect("region path");
    let mounts = out
        .lines()
        .skip_while(|l| *l != "--- mounts")
        .take_while(|l| *l != "--- meminfo")
        .collect::<Vec<_>>()
        .join("\n");
    assert!(mounts.contains(" /etc/ld.so.preload "), "{mounts}");
    assert!(mounts.contains("libtessera_vgpu.so"), "{mounts}");
    let region_dir = std::path::Path::new(region)
        .parent()
        .unwrap()
        .display()
        .to_string();
    assert!(
        mounts.contains(&format!(" {region_dir} ")),
        "{region_dir} not in {mounts}"
    );

    let meminfo = values(&out, "--- meminfo");
    assert_eq!(number(&meminfo, "total"), 1024 * MIB, "{out}");
    assert_eq!(number(&meminfo, "devtotal"), 1024 * MIB, "{out}");
    let free = number(&meminfo, "free");
    assert!(free <= 1024 * MIB && free > 1024 * MIB - 2 * CHUNK, "{out}");

    let alloc = values(&out, "--- alloc");
    assert_eq!(
        alloc.get("last_rc").map(String::as_str),
        Some("2"),
        "stops with CUDA_ERROR_OUT_OF_MEMORY: {out}"
    );
    let reached = number(&alloc, "allocated") * CHUNK;
    assert!(
        reached <= free && free < reached + CHUNK,
        "allocation stops at the limit: reached {reached} of {free} free: {out}"
    );

    assert_eq!(
        allocation.status.and_then(|s| s.phase),
        Some(AllocationPhase::Allocated)
    );
    let locks: Api<NodeLock> = Api::all(stack.client.clone());
    assert!(
        locks.get_opt("node-a").await.unwrap().is_none(),
        "lock released after Allocate"
    );

    stack
        .pods()
        .delete("slice", &DeleteParams::default())
        .await
        .unwrap();
    let _ = &stack.tessera;
    let _ = &stack.nodes;
}
