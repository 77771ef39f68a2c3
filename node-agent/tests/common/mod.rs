//! What the end-to-end tests of the node agent share: a simulated GPU
//! host (Node, fake GPUs, kubelet simulator, the agent binary) on a real
//! control plane.

#![allow(dead_code)] // each test binary uses part of it

use tessera_testkit::cluster as support;

use std::{path::PathBuf, time::Duration};

use kube::{Api, Client};
use serde_json::json;
use support::Cluster;
use tessera_api::v1alpha1::VgpuAllocation;
use tessera_e2e::kubelet::{KubeletSim, Served};
use tessera_e2e::process::{Lifetime, Process};

pub const WAIT: Duration = Duration::from_secs(30);

/// One simulated GPU node: its Node object, fake GPUs, kubelet and agent.
pub struct GpuHost {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub kubelet: KubeletSim,
    pub agent: Option<Process>,
    pub metrics_port: u16,
}

impl GpuHost {
    pub fn gpus_file(&self) -> PathBuf {
        self.dir.path().join("gpus.yaml")
    }

    pub fn write_gpus(&self, healthy: &[bool]) {
        let devices: Vec<serde_json::Value> = healthy
            .iter()
            .enumerate()
            .map(|(i, ok)| {
                json!({
                    "uuid": format!("GPU-{}-{i}", self.name), "index": i,
                    "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "numaNode": i / 2,
                    "health": if *ok { "Healthy" } else { "Unhealthy" },
                })
            })
            .collect();
        let yaml = serde_yaml_ng::to_string(&json!({ "devices": devices })).unwrap();
        std::fs::write(self.gpus_file(), yaml).unwrap();
    }

    pub async fn start(cluster: &Cluster, name: &str, gpus: usize) -> Self {
        cluster.add_node(name, json!({"gpu-pool": "a100"})).await;
        Self::start_on(&cluster.client, cluster.plane.kubeconfig(), name, gpus).await
    }

    /// Its kubelet and agent for the Node `name`, which exists already.
    pub async fn start_on(
        client: &Client,
        kubeconfig: &std::path::Path,
        name: &str,
        gpus: usize,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = KubeletSim::start(
            client.clone(),
            name,
            &dir.path().join("device-plugins"),
            "nvidia.com/gpu",
        )
        .await
        .unwrap();
        let mut host = Self {
            name: name.to_owned(),
            dir,
            kubelet,
            agent: None,
            metrics_port: tessera_e2e::free_port().unwrap(),
        };
        host.write_gpus(&vec![true; gpus]);
        host.start_agent(kubeconfig);
        host
    }

    /// Runs the agent binary, as the DaemonSet would, against this host's
    /// kubelet directory and fake GPUs.
    pub fn start_agent(&mut self, kubeconfig: &std::path::Path) {
        let state = self.dir.path().join("state");
        let own = |sub: &str| self.dir.path().join(sub).display().to_string();
        let args: Vec<String> = [
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--node-name",
            &self.name,
            "--backend",
            "fake",
            "--fake-gpus-file",
            &self.gpus_file().display().to_string(),
            "--gpu-poll-millis",
            "100",
            "--device-plugin-dir",
            &self.kubelet.dir().display().to_string(),
            // The DRA plugin's sockets and CDI specs: the node's own, never
            // the host's /var/lib/kubelet.
            "--kubelet-plugins-dir",
            &own("plugins"),
            "--plugins-registry-dir",
            &own("plugins_registry"),
            "--cdi-dir",
            &own("cdi"),
            "--interposer-library",
            "/opt/tessera/libtessera_vgpu.so",
            "--state-dir",
            &state.display().to_string(),
            // The kubelet simulator reads the variable; no NVIDIA toolkit.
            "--device-list-strategy=envvar",
            "--accept-envvar-device-selection",
            "--lease-namespace",
            "default",
            "--metrics-addr",
            &format!("127.0.0.1:{}", self.metrics_port),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let agent = Process::spawn(
            "tessera-node-agent",
            std::path::Path::new(env!("CARGO_BIN_EXE_tessera-node-agent")),
            &args,
            self.dir.path().join("agent.log"),
            Lifetime::Tied,
        )
        .unwrap();
        self.agent = Some(agent);
    }

    pub fn stop_agent(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.stop();
        }
    }

    /// The agent's `/metrics` text.
    pub async fn metrics(&self) -> String {
        support::scrape(self.metrics_port).await
    }

    pub fn agent_log(&self) -> String {
        tessera_e2e::process::log_tail(&self.dir.path().join("agent.log"), 40)
    }

    pub async fn served(&self, pod: &str) -> Vec<Served> {
        let state = self
            .kubelet
            .wait_for(&format!("Allocate for {pod}"), WAIT, |s| {
                s.served.iter().any(|c| c.pod == pod)
                    || s.failures
                        .iter()
                        .any(|(p, _)| p.ends_with(&format!("/{pod}")))
            })
            .await
            .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", self.agent_log()));
        assert!(
            state
                .failures
                .iter()
                .all(|(p, _)| !p.ends_with(&format!("/{pod}"))),
            "{pod} was refused: {:?}; agent log:\n{}",
            state.failures,
            self.agent_log()
        );
        state.served.into_iter().filter(|c| c.pod == pod).collect()
    }
}

pub async fn eventually<F: AsyncFn() -> bool>(what: &str, check: F) {
    tessera_testkit::eventually(what, WAIT, check).await;
}

pub async fn allocation(client: &Client, pod: &str) -> VgpuAllocation {
    Api::<VgpuAllocation>::namespaced(client.clone(), "default")
        .get(pod)
        .await
        .unwrap()
}

pub async fn wait_published(cluster: &Cluster, host: &GpuHost, gpus: usize) {
    eventually("the agent's GpuNode reaches the scheduler", async || {
        cluster
            .projection
            .read()
            .node(&host.name)
            .is_some_and(|n| n.devices.len() == gpus)
    })
    .await;
}
