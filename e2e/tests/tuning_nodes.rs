//! The tuning advice on real nodes: Tessera installed with `helm install`,
//! two nodes in two GpuNodeConfigs, real pods driving each into the tuning
//! guide's cases (性能调优指南 §5.2), and the advice with its evidence read from
//! the controller's `/metrics` and the configs' `status.tuning`. The
//! controller reads the agents every 2 s over a 2-minute window, advising
//! after 10 s, counting pods that waited 5 s and writing a config's advice
//! at most every 5 s (chart values `scheduler.tuning.*`).
//!
//! - `lean` (node tune-a, `deviceSplitCount: 1`, `gpuCorePolicy: force`):
//!   lean-1 holds 800 of its 8000 MiB and launches nothing under its 50 %
//!   compute limit, lean-2 waits for the GPU's one slice: raise
//!   `deviceMemoryScaling` (10 % of limits), lower `gpucores` (0 % of
//!   limits), raise `deviceSplitCount`.
//! - `tight` (node tune-b, `deviceMemoryScaling: 2.0`): tight-1 holds 3800
//!   of its 4000 MiB, tight-2 asks for more memory than is left: lower
//!   `deviceMemoryScaling` (95 % of limits on oversubscribed memory), add
//!   GPU nodes.
//!
//! Needs what the real-node tests need; `TESSERA_SKIP_REAL_NODES=1` skips
//! it, never silently.

use std::time::{Duration, Instant};

use kube::{Api, ResourceExt, api::PostParams};
use serde_json::{Value, json};
use tessera_api::v1alpha1::{GpuNodeConfig, TuningStatus};
use tessera_e2e::testkit::{gpu_pod, wait_for};
use tessera_e2e::{
    Lifetime,
    artifacts::Artifacts,
    cluster::{LocalCluster, NAMESPACE, NodeGpus},
    node::FakeGpu,
};

const WAIT: Duration = Duration::from_secs(180);
const MIB: u64 = 1 << 20;

fn config(name: &str, node: &str, spec: Value) -> GpuNodeConfig {
    let mut spec = spec;
    spec["nodeNames"] = json!([node]);
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// `gpu_pod` pinned to `node`.
fn on(node: &str, name: &str, mem_mib: u64, cores: Option<u32>, script: &str) -> Value {
    let mut pod = gpu_pod(name, mem_mib, cores, script);
    pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    pod
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn each_case_of_the_tuning_guide_shows_as_advice_with_its_evidence() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let nodes = ["tune-a", "tune-b"].map(|name| NodeGpus {
        name: name.into(),
        gpus: FakeGpu::many(name, 1, "NVIDIA A100-SXM4-80GB", 81920, 1),
        ..Default::default()
    });
    let configs = [
        config(
            "lean",
            "tune-a",
            json!({"deviceSplitCount": 1, "gpuCorePolicy": "force"}),
        ),
        config("tight", "tune-b", json!({"deviceMemoryScaling": 2.0})),
    ];
    let mut cluster = LocalCluster::start_with_configs(
        None,
        Lifetime::Tied,
        &nodes,
        &artifacts,
        json!({}),
        &configs,
    )
    .await
    .unwrap();
    cluster
        .helm_install(&[
            "--set",
            "scheduler.tuning.intervalSeconds=2",
            "--set",
            "scheduler.tuning.windowSeconds=120",
            "--set",
            "scheduler.tuning.minObservedSeconds=10",
            "--set",
            "scheduler.tuning.waitSeconds=5",
            "--set",
            "scheduler.tuning.writeGapSeconds=5",
        ])
        .await
        .unwrap();
    let client = cluster.plane.client().await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let hold = |mib: u64| format!("cuda-probe hold {}; sleep 3600", mib * MIB);
    // tune-a has one slice: lean-1 (the compute limit the advice is about)
    // must hold it and lean-2 wait for one, so lean-1 is bound first (made
    // together, either could win the slice, and once lean-2 did).
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(on("tune-a", "lean-1", 8000, Some(50), &hold(800))).unwrap(),
    )
    .await
    .unwrap();
    wait_for("lean-1 to be bound", WAIT, async || {
        pods.get("lean-1").await.ok()?.spec?.node_name
    })
    .await;
    for pod in [
        on("tune-a", "lean-2", 1000, None, "sleep 3600"),
        on("tune-b", "tight-1", 4000, None, &hold(3800)),
        // tune-b offers 163,840 MiB at scaling 2.0; 4,000 are taken.
        on("tune-b", "tight-2", 160_840, None, "sleep 3600"),
    ] {
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap();
    }

    // Every piece of advice, from the controller's /metrics: the pod the
    // upgrade made, once the one it replaced is gone (listed by name, a
    // terminating pod may come first, and it was once read instead).
    let deadline = Instant::now() + WAIT;
    let controller = loop {
        let mut pods = cluster.pods("scheduler").await.unwrap();
        if let [pod] = pods.as_slice()
            && pod.metadata.deletion_timestamp.is_none()
        {
            break pods.remove(0);
        }
        assert!(
            Instant::now() < deadline,
            "the upgrade's scheduler pod alone within {WAIT:?}: {:?}",
            pods.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let ip = controller.status.and_then(|s| s.pod_ip).unwrap();
    let metrics = format!("{ip}:9395");
    let expected = [
        r#"tessera_tuning_advice{pool="lean",setting="deviceMemoryScaling",from="1.0",to="2.0"} 1"#,
        r#"tessera_tuning_advice{pool="lean",setting="gpucores",from="",to=""} 1"#,
        r#"tessera_tuning_advice{pool="lean",setting="deviceSplitCount",from="1",to="2"} 1"#,
        r#"tessera_tuning_advice{pool="tight",setting="deviceMemoryScaling",from="2.0",to="1.0"} 1"#,
        r#"tessera_tuning_advice{pool="tight",setting="nodes",from="",to=""} 1"#,
    ];
    let deadline = Instant::now() + WAIT;
    let text = loop {
        let text = tessera_e2e::http::get_body(&metrics, "/metrics")
            .await
            .unwrap_or_default();
        if expected.iter().all(|line| text.lines().any(|l| l == *line)) {
            break text;
        }
        if Instant::now() >= deadline {
            // What the controller saw: the configs' matches as the API
            // server has them, and its log about configs, leadership and
            // anything that went wrong.
            let configs = Api::<GpuNodeConfig>::all(client.clone())
                .list(&Default::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .map(|c| {
                            format!(
                                "{}: matched {:?}",
                                c.name_any(),
                                c.status.as_ref().map(|s| &s.matched_nodes)
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            let name = controller.metadata.name.clone().unwrap_or_default();
            let logs = cluster
                .plane
                .kubectl()
                .unwrap()
                .args(["logs", "-n", NAMESPACE, &name, "-c", "controller"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let logs: Vec<&str> = logs
                .lines()
                .filter(|l| {
                    ["onfig", "leader", "tuning", "WARN", "ERROR", "panicked"]
                        .iter()
                        .any(|word| l.contains(word))
                })
                .collect();
            panic!(
                "not every advice within {WAIT:?}; the controller's tuning series:\n{}\nconfigs: {configs:#?}\ncontroller {name}'s log:\n{}",
                text.lines()
                    .filter(|l| l.starts_with("tessera_tuning")
                        || l.starts_with("tessera_gpu_pod_waiting"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let tuning_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tessera_tuning_advice{"))
        .collect();
    assert_eq!(tuning_lines.len(), expected.len(), "{tuning_lines:#?}");
    for line in [
        r#"tessera_tuning_memory_used_p95_percent{pool="lean"} 10.0"#,
        r#"tessera_tuning_compute_used_p95_percent{pool="lean"} 0.0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }

    // And in each config's status, with its evidence (written again when
    // it changes, every 5 s at most here).
    let api: Api<GpuNodeConfig> = Api::all(client.clone());
    let status = |name: &'static str, settings: &'static [&'static str]| {
        let api = api.clone();
        async move {
            let deadline = Instant::now() + WAIT;
            loop {
                let tuning: Option<TuningStatus> =
                    api.get(name).await.ok().and_then(|c| c.status?.tuning);
                let written: Vec<&str> = tuning
                    .iter()
                    .flat_map(|t| t.advice.iter().map(|a| a.setting.as_str()))
                    .collect();
                if written == settings {
                    return tuning.unwrap();
                }
                assert!(
                    Instant::now() < deadline,
                    "{name}'s status.tuning never advised {settings:?}: {tuning:#?}"
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let lean = status(
        "lean",
        &["deviceMemoryScaling", "gpucores", "deviceSplitCount"],
    )
    .await;
    assert_eq!((lean.gpus, lean.window_seconds), (1, 120), "{lean:#?}");
    assert_eq!(lean.memory_used_p95_percent, Some(10), "{lean:#?}");
    assert_eq!(lean.compute_used_p95_percent, Some(0), "{lean:#?}");
    assert_eq!(
        lean.waited
            .iter()
            .map(|w| (w.lack.as_str(), w.pods))
            .collect::<Vec<_>>(),
        [("slice", 1)],
        "{lean:#?}"
    );
    let messages: Vec<&str> = lean.advice.iter().map(|a| a.message.as_str()).collect();
    assert!(
        messages[0]
            .starts_with("deviceMemoryScaling 1.0 → 2.0: p95 memory use 10 % of limits over "),
        "{messages:#?}"
    );
    assert!(
        messages[1].starts_with("lower the pods' nvidia.com/gpucores, or gpuCorePolicy: disable: p95 compute use 0 % of limits"),
        "{messages:#?}"
    );
    assert!(
        messages[2].starts_with("deviceSplitCount 1 → 2: 1 pod waited for a free slice (longest "),
        "{messages:#?}"
    );
    let tight = status("tight", &["deviceMemoryScaling", "nodes"]).await;
    assert_eq!(tight.memory_used_p95_percent, Some(95), "{tight:#?}");
    assert_eq!(
        (
            tight.advice[0].from.as_deref(),
            tight.advice[0].to.as_deref()
        ),
        (Some("2.0"), Some("1.0")),
        "{tight:#?}"
    );
    assert!(
        tight.advice[1]
            .message
            .starts_with("add GPU nodes: 1 pod waited for memory (longest "),
        "{tight:#?}"
    );
}
