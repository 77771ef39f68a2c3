//! The node agent against a real local API server: latency of the kubelet's
//! Allocate call over the plugin's unix socket (the agent reads the node's
//! NodeLock and the holder's VgpuAllocation and records the container as
//! served, which releases the lock), and the agent's resident memory with 8
//! GPUs.
//!
//! `cargo bench -p tessera-node-agent --bench allocate` (or `make bench`).
//! The agent is the release binary, run as its own process with the fake
//! backend; the kubelet side is the e2e crate's simulator (registration)
//! plus a gRPC client timing Allocate.

#![allow(missing_docs)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use serde_json::json;
use tessera_api::{
    testing,
    v1alpha1::{DeviceSlice, NodeLock, VgpuAllocation},
};
use tessera_deviceplugin::{
    connect_unix,
    v1beta1::{
        AllocateRequest, ContainerAllocateRequest, device_plugin_client::DevicePluginClient,
    },
};
use tessera_e2e::{
    ControlPlane,
    kubelet::KubeletSim,
    process::{Lifetime, Process},
};

const NODE: &str = "bench-node";
const GPUS: usize = 8;
const ROUNDS: usize = 300;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::main]
async fn main() {
    let plane = ControlPlane::start().await.expect("control plane");
    let client = plane.client().await.unwrap();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": NODE}})).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let devices: Vec<serde_json::Value> = (0..GPUS)
        .map(|i| json!({"uuid": format!("GPU-bench-{i}"), "index": i, "model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNode": i / 4}))
        .collect();
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(
        &gpus,
        serde_yaml_ng::to_string(&json!({"devices": devices})).unwrap(),
    )
    .unwrap();
    let plugins = dir.path().join("device-plugins");
    let kubelet = KubeletSim::start(client.clone(), NODE, &plugins, "nvidia.com/gpu")
        .await
        .unwrap();
    let args: Vec<String> = [
        "--kubeconfig",
        &plane.kubeconfig().display().to_string(),
        "--node-name",
        NODE,
        "--backend",
        "fake",
        "--fake-gpus-file",
        &gpus.display().to_string(),
        "--device-plugin-dir",
        &plugins.display().to_string(),
        "--state-dir",
        &dir.path().join("state").display().to_string(),
        "--lease-namespace",
        "default",
        "--metrics-addr",
        "127.0.0.1:0",
        "--log",
        "warn",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let agent = Process::spawn(
        "tessera-node-agent",
        std::path::Path::new(env!("CARGO_BIN_EXE_tessera-node-agent")),
        &args,
        dir.path().join("agent.log"),
        Lifetime::Tied,
    )
    .unwrap();
    let state = kubelet
        .wait_for("the agent's registration", Duration::from_secs(60), |s| {
            s.devices.len() == GPUS * 10
        })
        .await
        .unwrap();
    let endpoint = state.plugin.unwrap().0;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_rss = rss_kib(agent.pid());

    let mut plugin = DevicePluginClient::new(connect_unix(&plugins.join(endpoint)).await.unwrap());
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), "default");
    let locks: Api<NodeLock> = Api::all(client.clone());
    let mut latencies = Vec::with_capacity(ROUNDS);
    let mut reads = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let name = format!("bench-{round}");
        let uid = format!("uid-{round}");
        let gpu = format!("GPU-bench-{}", round % GPUS);
        let allocation = testing::allocation(&name, &uid, NODE)
            .container(testing::container(
                "main",
                vec![DeviceSlice {
                    family: Default::default(),
                    template: None,
                    model: "NVIDIA H100 80GB HBM3".into(),
                    ..testing::slice(&gpu, u32::try_from(round % GPUS).unwrap(), 1000, 10)
                }],
            ))
            .build();
        allocations
            .create(&PostParams::default(), &allocation)
            .await
            .unwrap();
        // Taken as Bind takes it: created once, then updated in place.
        let mut lock = held_lock(&name, &uid);
        match locks.get_opt(NODE).await.unwrap() {
            None => drop(locks.create(&PostParams::default(), &lock).await.unwrap()),
            Some(free) => {
                lock.metadata.resource_version = free.metadata.resource_version;
                locks
                    .replace(NODE, &PostParams::default(), &lock)
                    .await
                    .unwrap();
            }
        }
        // As in a cluster: between the lock and the kubelet's Allocate come
        // Bind's re-check, its allocation and binding writes, and the
        // kubelet's admission, so the agent's watch has the allocation.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let read = Instant::now();
        locks.get(NODE).await.unwrap();
        reads.push(read.elapsed());

        let started = Instant::now();
        let response = plugin
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![format!("{gpu}::0")],
                }],
            })
            .await
            .unwrap()
            .into_inner();
        latencies.push(started.elapsed());
        assert_eq!(
            response.container_responses[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"],
            "1000m"
        );
        // The agent's `Allocated` write released the lock; make sure before
        // the next round.
        loop {
            let served = allocations.get(&name).await.unwrap();
            if !lock.held_among(&[served]) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let busy_rss = rss_kib(agent.pid());
    latencies.sort();
    reads.sort();
    println!(
        "Node agent, {GPUS} fake GPUs (split 10), real kube-apiserver on this machine, {ROUNDS} rounds"
    );
    println!(
        "Allocate over the unix socket: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3
    );
    println!(
        "for scale, one GET of the NodeLock from the benchmark's own client: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&reads, 0.50).as_secs_f64() * 1e3,
        percentile(&reads, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "agent resident memory: {:.1} MiB idle after registration, {:.1} MiB after {ROUNDS} Allocates",
        idle_rss as f64 / 1024.0,
        busy_rss as f64 / 1024.0
    );
}

/// The NodeLock the scheduler extender would have taken for the pod.
fn held_lock(allocation: &str, uid: &str) -> NodeLock {
    use k8s_openapi::jiff::Timestamp;
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap();
    testing::node_lock(
        NODE,
        testing::pod_ref("default", allocation, uid),
        allocation,
        now,
        60,
    )
}
