//! The files a real node's containerd, CNI plugins, kubelet and node agent read.

use std::path::Path;

use serde_json::json;

use crate::images::PAUSE_IMAGE;

/// One fake GPU, as the node agent's fake backend reads it.
#[derive(Debug, Clone)]
pub struct FakeGpu {
    /// The GPU's UUID (`GPU-…`).
    pub uuid: String,
    /// The model name, e.g. "NVIDIA A100-SXM4-80GB".
    pub model: String,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// The NUMA node the GPU is attached to.
    pub numa_node: u32,
}

impl FakeGpu {
    /// `count` GPUs of one model, `per_numa` per NUMA node, with UUIDs
    /// derived from the node's name.
    pub fn many(
        node: &str,
        count: usize,
        model: &str,
        memory_mib: u64,
        per_numa: usize,
    ) -> Vec<Self> {
        (0..count)
            .map(|i| Self {
                uuid: format!("GPU-{node}-{i}"),
                model: model.to_owned(),
                memory_mib,
                numa_node: (i / per_numa.max(1)) as u32,
            })
            .collect()
    }
}

/// The devices of the agent's `--fake-gpus-file` (also the chart's
/// `agent.fakeGpus.<node>` value).
pub fn fake_devices(gpus: &[FakeGpu]) -> Vec<serde_json::Value> {
    gpus.iter()
        .enumerate()
        .map(|(index, gpu)| {
            let mut device = json!({
                "uuid": gpu.uuid, "index": index, "model": gpu.model,
                "memoryMiB": gpu.memory_mib, "numaNode": gpu.numa_node, "health": "Healthy",
                "driverVersion": FAKE_DRIVER_VERSION,
            });
            if let Some(capability) = compute_capability(&gpu.model) {
                device["computeCapability"] = json!(capability);
            }
            device
        })
        .collect()
}

/// The driver version fake GPUs report.
pub const FAKE_DRIVER_VERSION: &str = "550.54.15";

/// The CUDA compute capability of the models the tests and the demo use,
/// as NVIDIA documents them.
fn compute_capability(model: &str) -> Option<&'static str> {
    [
        ("H100", "9.0"),
        ("H200", "9.0"),
        ("A100", "8.0"),
        ("L40S", "8.9"),
        ("L4", "8.9"),
    ]
    .into_iter()
    .find(|(name, _)| model.contains(name))
    .map(|(_, capability)| capability)
}

/// The agent's `--fake-gpus-file`.
pub(crate) fn fake_gpus(gpus: &[FakeGpu]) -> String {
    serde_yaml_ng::to_string(&json!({ "devices": fake_devices(gpus) })).unwrap_or_default()
}

/// containerd's configuration (version 2, which containerd 2 migrates): its
/// own root, state and sockets, the CRI plugin with the locally built sandbox
/// image, overlayfs and runc, and CDI specs from the node's `cdi` directory.
pub(crate) fn containerd(dir: &Path, stream_port: u16) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "{stream_port}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{d}/cdi"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni/conf"
"#
    )
}

/// A bridge network for the node's pods: its own bridge and /24.
pub(crate) fn cni(dir: &Path, bridge: &str, subnet: &str) -> String {
    let config = json!({
        "cniVersion": "0.4.0",
        "name": bridge,
        "plugins": [
            {
                "type": "bridge", "bridge": bridge, "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "dataDir": dir.join("cni/ipam").display().to_string(),
                },
            },
            {"type": "loopback"},
        ],
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// Ports a kubelet listens on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KubeletPorts {
    pub(crate) api: u16,
    pub(crate) healthz: u16,
}

/// The kubelet's configuration: cgroupfs under the node's own cgroup root,
/// its own ports and pod log directory, eviction and image GC relaxed (the
/// nodes share one disk), anonymous access to its API on the host address.
pub(crate) fn kubelet(
    dir: &Path,
    node_ip: &str,
    cgroup_root: &str,
    ports: KubeletPorts,
    cgroup_v1: bool,
    minor: u32,
) -> String {
    let mut config = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failSwapOn": false,
        "address": node_ip,
        "port": ports.api,
        "readOnlyPort": 0,
        "healthzPort": ports.healthz,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": dir.join("pod-logs").display().to_string(),
        "containerRuntimeEndpoint": format!("unix://{}", dir.join("containerd.sock").display()),
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": false,
        "resolvConf": "",
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": false,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "maxPods": 250,
    });
    // Fields and gates of newer kubelets: an older one refuses a gate it
    // does not know (the install smoke test runs the oldest claimed).
    if minor >= 31 {
        config["failCgroupV1"] = json!(!cgroup_v1);
    }
    if minor >= 35 {
        // A container that dies (the node agent killed by a chaos test) is
        // started again within a second instead of after up to 5 minutes
        // of CrashLoopBackOff (KEP-5593, beta in 1.35).
        config["featureGates"] = json!({"KubeletCrashLoopBackOffMax": true});
        config["crashLoopBackOff"] = json!({"maxContainerRestartPeriod": "1s"});
    }
    serde_yaml_ng::to_string(&config).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_gpus_match_the_agent_format() {
        let yaml = fake_gpus(&FakeGpu::many("n1", 3, "NVIDIA H100 80GB HBM3", 81559, 2));
        let value: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(value["devices"][2]["uuid"], "GPU-n1-2");
        assert_eq!(value["devices"][2]["numaNode"], 1);
        assert_eq!(value["devices"][1]["memoryMiB"], 81559);
    }

    #[test]
    fn kubelet_keeps_cgroup_v1_only_where_it_runs() {
        let ports = KubeletPorts { api: 1, healthz: 2 };
        let config = |cgroup_v1, minor| -> serde_json::Value {
            let text = kubelet(Path::new("/n"), "10.0.0.1", "/t", ports, cgroup_v1, minor);
            serde_yaml_ng::from_str(&text).unwrap()
        };
        let v1 = config(true, 36);
        assert_eq!(v1["failCgroupV1"], false);
        assert_eq!(v1["cgroupRoot"], "/t");
        assert_eq!(v1["containerRuntimeEndpoint"], "unix:///n/containerd.sock");
        assert_eq!(v1["featureGates"]["KubeletCrashLoopBackOffMax"], true);
        assert_eq!(config(false, 36)["failCgroupV1"], true);
    }

    #[test]
    fn an_older_kubelet_is_given_only_what_it_knows() {
        let ports = KubeletPorts { api: 1, healthz: 2 };
        let text = kubelet(Path::new("/n"), "10.0.0.1", "/t", ports, true, 30);
        let old: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert!(old.get("failCgroupV1").is_none(), "{text}");
        assert!(old.get("featureGates").is_none(), "{text}");
        assert!(old.get("crashLoopBackOff").is_none(), "{text}");
        assert_eq!(old["maxPods"], 250);
    }
}
