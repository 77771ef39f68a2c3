//! Tenants attacking their shared-region directory on a real node (issue 12):
//! pods that truncate and restore their region in a loop (the measured
//! failure: the agent died of SIGBUS within seconds), replace it with a
//! symbolic link to a host file, a hard link, a directory, a FIFO or a
//! sparse 8 GiB file, fill it with random bytes, or give it a valid header
//! with an absurd slot count. Meanwhile another pod, created before the
//! attacks, and a third, created while they run, are served by the same
//! node's agent and reported in its metrics; the agent keeps its pid, logs
//! one warning per attacking container, and writes nothing through links.
//!
//! Needs what `real_nodes.rs` needs (root, containerd, runc, CNI plugins,
//! busybox-static); `TESSERA_SKIP_REAL_NODES=1` skips it, loudly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tessera_e2e::artifacts::Artifacts;
use tessera_e2e::node::{AgentMode, FakeGpu, NodeSpec, RealNode};
use tessera_e2e::stack::Tessera;
use tessera_e2e::testkit::{gpu_pod, phase, sample};
use tessera_e2e::{ControlPlane, images};

const WAIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;
const WARNING: &str = "refusing a container's shared region";

/// Fields drop in order: the node before the control plane.
struct Stack {
    node: RealNode,
    _tessera: Tessera,
    client: Client,
    plane: ControlPlane,
}

impl Stack {
    async fn start() -> Self {
        tessera_e2e::remove_stale_dirs();
        let artifacts = Artifacts::locate().unwrap();
        let plane = ControlPlane::start().await.unwrap();
        let client = plane.client().await.unwrap();
        let archives = images::build(&plane.dir().join("images"), &artifacts).unwrap();
        let tessera = Tessera::deploy(&plane, &artifacts).await.unwrap();
        let spec = NodeSpec {
            name: "node-h".to_owned(),
            gpus: FakeGpu::many("node-h", 2, "NVIDIA A100-SXM4-80GB", 81920, 2),
            labels: BTreeMap::from([("gpu".to_owned(), "on".to_owned())]),
            agent: AgentMode::Host,
        };
        let node = RealNode::start(&plane, &spec, &artifacts, &archives)
            .await
            .unwrap();
        Self {
            node,
            _tessera: tessera,
            client,
            plane,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, pod: Value) {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    async fn wait_running(&self, name: &str) -> Pod {
        let deadline = Instant::now() + WAIT;
        loop {
            let pod = self.pods().get_opt(name).await.unwrap();
            if let Some(pod) = &pod
                && phase(pod) == "Running"
            {
                return pod.clone();
            }
            assert!(
                Instant::now() < deadline,
                "pod {name} never ran: {:#?}",
                pod.and_then(|p| p.status)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn logs(&self, pod: &str) -> String {
        self.plane.logs("default", pod).unwrap()
    }

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

    async fn metrics(&self) -> String {
        let addr = format!("127.0.0.1:{}", self.node.metrics_port());
        tessera_e2e::http::get_body(&addr, "/metrics")
            .await
            .unwrap()
    }

    /// The node agent's pid, as the harness recorded it in `node.json`.
    fn agent_pid(&self) -> u32 {
        let state: Value =
            serde_json::from_slice(&std::fs::read(self.node.dir().join("node.json")).unwrap())
                .unwrap();
        state["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p[0] == "tessera-node-agent")
            .and_then(|p| p[1].as_u64())
            .map(|pid| u32::try_from(pid).unwrap())
            .expect("the agent's pid in node.json")
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.node.dir().join("tessera-node-agent.log")).unwrap_or_default()
    }

    /// The host directory of a pod's region (`<uid>_cuda`).
    fn region_dir(&self, pod: &Pod) -> PathBuf {
        let uid = pod.metadata.uid.as_deref().unwrap();
        self.node.dir().join(format!("agent/containers/{uid}_cuda"))
    }
}

/// The attacks, by pod name: each first makes a valid region (one CUDA
/// call), keeps a copy, then does its worst.
fn attacks(host_file: &Path) -> Vec<(&'static str, String)> {
    let host = host_file.display();
    [
        (
            "truncate-loop",
            "while true; do cp /tmp/copy $R; : > $R; done".to_owned(),
        ),
        ("symlink", format!("rm -f $R; ln -s {host} $R")),
        ("hardlink", "ln $R $D/second".to_owned()),
        ("directory", "rm -f $R; mkdir $R".to_owned()),
        ("fifo", "rm -f $R; mkfifo $R".to_owned()),
        (
            "sparse",
            "rm -f $R; dd if=/dev/zero of=$R bs=1M count=0 seek=8192".to_owned(),
        ),
        (
            "random",
            "head -c 197696 /dev/urandom > /tmp/noise; cat /tmp/noise > $R".to_owned(),
        ),
        (
            // slot_count (offset 24) = 0xffffffff in an otherwise valid header.
            "absurd-header",
            r"printf '\377\377\377\377' | dd of=$R bs=1 seek=24 conv=notrunc".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(name, attack)| {
        let script = format!(
            "R=$CUDA_DEVICE_MEMORY_SHARED_CACHE; D=$(dirname $R); \
             cuda-probe meminfo 0 > /dev/null; cp $R /tmp/copy; \
             echo '--- attacking'; {attack}; echo '--- attacked'; sleep 3600"
        );
        (name, script)
    })
    .collect()
}

fn attacker(name: &str, script: &str) -> Value {
    let mut pod = gpu_pod(name, 256, None, script);
    // The truncation loop spins: keep it from starving the node's agent of
    // the test machine's few cores (the attack still runs thousands of
    // rounds a second).
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("250m");
    pod
}

fn victim(name: &str, hold: u64) -> Value {
    let mut pod = gpu_pod(
        name,
        1024,
        Some(30),
        &format!("cuda-probe hold {hold}; sleep 3600"),
    );
    // High priority makes the agent's arbiter read every region on the
    // node every 200 ms, the attackers' included.
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = json!(0);
    pod
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn pods_attacking_their_region_neither_hurt_the_agent_nor_their_neighbours() {
    let started = Instant::now();
    let stack = Stack::start().await;
    let agent = stack.agent_pid();
    let host_file = stack.plane.dir().join("host-file");
    let secret = b"the host's file: nothing may be written through a tenant's link\n";
    std::fs::write(&host_file, secret).unwrap();

    const HOLD: u64 = 600 * MIB;
    stack.create(victim("victim", HOLD)).await;
    let mut victims = vec![stack.region_dir(&stack.wait_running("victim").await)];
    stack.wait_output("victim", "ready=1").await;

    let attacks = attacks(&host_file);
    for (name, script) in &attacks {
        stack.create(attacker(name, script)).await;
    }
    let mut attackers = Vec::new();
    for (name, _) in &attacks {
        let pod = stack.wait_running(name).await;
        stack.wait_output(name, "--- attacking").await;
        attackers.push((*name, stack.region_dir(&pod)));
    }
    for (name, _) in attacks.iter().filter(|(n, _)| *n != "truncate-loop") {
        stack.wait_output(name, "--- attacked").await;
    }

    // A pod created while the attacks run is served by the same agent.
    stack.create(victim("victim-late", HOLD)).await;
    victims.push(stack.region_dir(&stack.wait_running("victim-late").await));
    stack.wait_output("victim-late", "ready=1").await;

    // Both victims' usage is in the metrics, every attacker was warned
    // about and its refusals counted.
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = stack.metrics().await;
        let log = stack.agent_log();
        let victims_seen = ["victim", "victim-late"].iter().all(|pod| {
            sample(&metrics, "hami_vgpu_memory_used_bytes", pod)
                .is_some_and(|used| used >= HOLD as f64 && used <= (1024 * MIB) as f64)
        });
        let unwarned: Vec<&str> = attackers
            .iter()
            .filter(|(name, dir)| {
                !warned(&log, dir)
                    || sample(&metrics, "tessera_container_region_refused_total", name)
                        .is_none_or(|n| n < 1.0)
            })
            .map(|(name, _)| *name)
            .collect();
        if victims_seen && unwarned.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "victims in metrics: {victims_seen}; not warned about or counted: {unwarned:?}\n\
             {metrics}\n--- agent log\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The attacks go on for a while: the agent keeps serving, stays the
    // same process, and warns once per container (rate-limited).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let metrics = stack.metrics().await;
    for pod in ["victim", "victim-late"] {
        assert!(
            sample(&metrics, "hami_vgpu_memory_used_bytes", pod).is_some_and(|u| u >= HOLD as f64),
            "{pod} still reported:\n{metrics}"
        );
    }
    assert_eq!(stack.agent_pid(), agent, "the agent was never restarted");
    assert!(
        tessera_e2e::process::is_alive(agent),
        "the agent is alive:\n{}",
        stack.agent_log()
    );
    let log = stack.agent_log();
    for (name, dir) in &attackers {
        let lines = log
            .lines()
            .filter(|l| l.contains(WARNING) && l.contains(&*dir.to_string_lossy()))
            .count();
        assert_eq!(lines, 1, "one warning about {name}:\n{log}");
    }
    for dir in &victims {
        assert!(!warned(&log, dir), "no warning about {}", dir.display());
    }
    assert_eq!(
        std::fs::read(&host_file).unwrap(),
        secret,
        "host file intact"
    );
    let still = stack.logs("truncate-loop");
    assert!(
        !still.contains("--- attacked"),
        "the loop still runs: {still}"
    );

    for (name, _) in &attacks {
        let _ = stack.pods().delete(name, &DeleteParams::default()).await;
    }
    for pod in ["victim", "victim-late"] {
        let _ = stack.pods().delete(pod, &DeleteParams::default()).await;
    }
    for line in log.lines().filter(|l| l.contains(WARNING)) {
        eprintln!("{line}");
    }
    eprintln!("hostile region test took {:?}", started.elapsed());
}

/// Whether the agent's log warns about the region directory `dir`.
fn warned(log: &str, dir: &Path) -> bool {
    let dir = dir.to_string_lossy();
    log.lines()
        .any(|l| l.contains(WARNING) && l.contains(&*dir))
}
