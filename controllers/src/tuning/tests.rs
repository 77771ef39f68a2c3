//! Pools, waits, the status and when it is written.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tessera_api::{
    testing,
    v1alpha1::{CorePolicy, GpuNode, GpuNodeConfig, GpuNodeConfigStatus},
};

use super::*;
use crate::engine::tuning::Thresholds;

fn gpu_node(name: &str, gpus: u32, scaling: f64) -> GpuNode {
    let devices = (0..gpus).map(|i| testing::gpu(i, "A100", 81_920)).collect();
    let mut node = testing::gpu_node(name, devices);
    let status = node.status.as_mut().unwrap();
    status.gpu_count = gpus;
    status.settings.device_memory_scaling = scaling;
    node
}

fn config(name: &str, matched: &[&str]) -> GpuNodeConfig {
    let mut config: GpuNodeConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": name}, "spec": {},
    }))
    .unwrap();
    config.status = Some(GpuNodeConfigStatus {
        matched_nodes: matched.iter().map(|n| (*n).to_owned()).collect(),
        ..Default::default()
    });
    config
}

fn t(minutes: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + minutes * 60).unwrap()
}

fn wait(name: &str, since: i64, lacking: &[(&str, Lack)]) -> Wait {
    let waiting = crate::projection::waiting::Waiting::default();
    waiting.unfit(
        name,
        "ml",
        name,
        lacking.iter().map(|(n, l)| ((*n).to_owned(), *l)).collect(),
        t(since),
    );
    waiting.at(t(since), |_| false).remove(0)
}

#[test]
fn a_config_is_a_pool_of_its_gpu_nodes_and_every_other_node_its_own() {
    let nodes = [
        gpu_node("a", 4, 1.5),
        gpu_node("b", 2, 1.5),
        gpu_node("c", 8, 1.0),
    ];
    let configs = [
        config("pool", &["a", "b", "not-a-gpu-node"]),
        config("empty", &["not-a-gpu-node"]),
    ];
    let pools = pools(&configs, &nodes);
    let summary: Vec<(&str, Vec<&str>, u32, f64)> = pools
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.nodes.iter().map(String::as_str).collect(),
                p.gpus,
                p.current.memory_scaling,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("pool", vec!["a", "b"], 6, 1.5),
            ("node/c", vec!["c"], 8, 1.0)
        ]
    );
    assert_eq!(pools[0].config.as_deref(), Some("pool"));
    assert_eq!(pools[1].config, None);
}

#[test]
fn a_pod_counts_against_the_pools_whose_nodes_lacked_for_it_once_it_waited_long() {
    let pool: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
    let waits = [
        // 20 minutes, a lacked a slice and b memory: both count, once each.
        wait(
            "p1",
            0,
            &[("a", Lack::Slice), ("b", Lack::Memory), ("c", Lack::Cores)],
        ),
        // 30 minutes, a lacked a slice.
        wait("p2", -10, &[("a", Lack::Slice)]),
        // Only on another pool's node.
        wait("p3", 0, &[("c", Lack::Cores)]),
        // Not long enough yet.
        wait("p4", 15, &[("a", Lack::Slice)]),
    ];
    let w = waited(&waits, &pool, Duration::from_secs(600), t(20));
    assert_eq!(
        (w.slices.pods, w.slices.longest),
        (2, Duration::from_secs(1800))
    );
    assert_eq!((w.memory.pods, w.cores.pods), (1, 0));
}

fn advised(memory_p95: Option<f64>, advice: Vec<Advice>) -> PoolAdvice {
    PoolAdvice {
        pool: Pool {
            config: Some("pool".into()),
            name: "pool".into(),
            nodes: ["a".to_owned()].into(),
            gpus: 16,
            current: Current {
                memory_scaling: 1.0,
                split_count: 10,
                core_policy: CorePolicy::Default,
            },
        },
        observed: Observed {
            span: Duration::from_secs(6 * 3600),
            gpus: 16,
            memory_p95,
            compute_p95: None,
            waited: Waited {
                slices: WaitCount {
                    pods: 3,
                    longest: Duration::from_secs(1500),
                },
                ..Default::default()
            },
        },
        advice,
    }
}

#[test]
fn the_status_says_the_advice_with_its_evidence() {
    let pool = advised(
        Some(31.2),
        vec![
            Advice::RaiseMemoryScaling { from: 1.0, to: 1.9 },
            Advice::RaiseSplitCount { from: 10, to: 11 },
        ],
    );
    let status = status(&pool, Duration::from_secs(6 * 3600), t(0));
    assert_eq!(status.memory_used_p95_percent, Some(31));
    assert_eq!(status.compute_used_p95_percent, None);
    assert_eq!(status.waited.len(), 1);
    assert_eq!(
        (
            status.waited[0].lack.as_str(),
            status.waited[0].pods,
            status.waited[0].longest_seconds
        ),
        ("slice", 3, 1500)
    );
    let messages: Vec<&str> = status.advice.iter().map(|a| a.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "deviceMemoryScaling 1.0 → 1.9: p95 memory use 31 % of limits over 6h across 16 GPUs (or lower the pods' memory requests)",
            "deviceSplitCount 10 → 11: 3 pods waited for a free slice (longest 25m) over 6h across 16 GPUs",
        ]
    );
    assert_eq!(
        (
            status.advice[0].from.as_deref(),
            status.advice[0].to.as_deref()
        ),
        (Some("1.0"), Some("1.9"))
    );
}

const GAP: Duration = Duration::from_secs(600);

#[test]
fn a_status_is_written_when_its_gist_changed_at_most_every_ten_minutes() {
    let window = Duration::from_secs(6 * 3600);
    let first = status(&advised(Some(31.0), vec![]), window, t(0));
    assert!(due(None, &first, t(0), GAP));
    // Only the time and the span moved: nothing to write.
    let mut later = status(&advised(Some(31.0), vec![]), window, t(30));
    later.observed_seconds += 1800;
    assert!(!due(Some(&first), &later, t(30), GAP));
    // The evidence moved: written, but not within 10 minutes of the last.
    let moved = status(&advised(Some(35.0), vec![]), window, t(9));
    assert!(!due(Some(&first), &moved, t(9), GAP));
    assert!(due(Some(&first), &moved, t(10), GAP));
    // New advice likewise.
    let advice = status(
        &advised(Some(31.0), vec![Advice::LowerCoreLimits]),
        window,
        t(11),
    );
    assert!(due(Some(&first), &advice, t(11), GAP));
    // A status the controller cannot read the time of is replaced.
    let mut unreadable = first.clone();
    unreadable.computed_at = "yesterday".into();
    assert!(due(Some(&unreadable), &moved, t(1), GAP));
}

#[test]
fn each_pool_is_advised_from_its_own_nodes() {
    let mut history = History::new(Duration::from_secs(3 * 3600));
    for minute in 0..=120 {
        history.record(
            t(minute),
            [
                (
                    "a".to_owned(),
                    usage::NodeUse {
                        memory_used: 20.0,
                        memory_limit: 100.0,
                        core_used: 0.0,
                        core_limit: 0.0,
                    },
                ),
                (
                    "c".to_owned(),
                    usage::NodeUse {
                        memory_used: 80.0,
                        memory_limit: 100.0,
                        core_used: 10.0,
                        core_limit: 50.0,
                    },
                ),
            ]
            .into(),
        );
    }
    let nodes = [gpu_node("a", 4, 1.0), gpu_node("c", 8, 1.0)];
    let advice = evaluate(
        &history,
        pools(&[config("pool", &["a"])], &nodes),
        &[],
        &Thresholds::default(),
        t(120),
    );
    let summary: Vec<(&str, &[Advice])> = advice
        .iter()
        .map(|p| (p.pool.name.as_str(), p.advice.as_slice()))
        .collect();
    assert_eq!(
        summary,
        [
            // 20 % of limits at 1.0: 60 / 20 = 3, at most double.
            (
                "pool",
                &[Advice::RaiseMemoryScaling { from: 1.0, to: 2.0 }][..]
            ),
            // 80 % memory; compute 10 of 50: lower the limits.
            ("node/c", &[Advice::LowerCoreLimits][..]),
        ]
    );
    assert_eq!(advice[0].observed.span, Duration::from_secs(7200));
}

/// An agent that answers one request with `answer`.
async fn agent(answer: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 1024];
        let _ = stream.read(&mut request).await;
        let _ = stream.write_all(answer.as_bytes()).await;
    });
    endpoint
}

#[tokio::test]
async fn an_agents_metrics_are_read_over_http_and_a_refusal_says_why() {
    let ok = agent(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhami_vgpu_memory_limit_bytes{pod=\"a\"} 100\n",
    )
    .await;
    let text = scrape(&ok).await.unwrap();
    assert_eq!(usage::parse(&text).memory_limit, 100.0);
    let broken = agent("HTTP/1.1 503 Service Unavailable\r\n\r\nnot now").await;
    let error = scrape(&broken).await.unwrap_err();
    assert!(error.contains("503"), "{error}");
    // Nobody listening.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    assert!(scrape(&closed).await.is_err());
}
