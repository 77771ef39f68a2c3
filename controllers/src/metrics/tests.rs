//! The gauges the alerts read, set from watch events fed by hand.

use k8s_openapi::{
    api::coordination::v1::Lease,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::runtime::watcher::Event;
use serde_json::json;
use tessera_api::{
    testing,
    v1alpha1::{GpuDevice, GpuNode, NodeLock, VgpuAllocation},
};

use super::*;
use crate::projection::Feeder;

const NOW: &str = "2026-03-01T12:00:00Z";

/// `NOW` minus `seconds`.
fn at(seconds_ago: i64) -> Timestamp {
    let now: Timestamp = NOW.parse().unwrap();
    now - k8s_openapi::jiff::SignedDuration::from_secs(seconds_ago)
}

/// `NOW` minus `seconds`, as the API server writes it.
fn ago(seconds: i64) -> String {
    at(seconds).to_string()
}

fn setup() -> (Arc<Metrics>, Feeder) {
    let (projection, feeder) = Projection::new();
    (Metrics::new(projection, Default::default()), feeder)
}

fn render(metrics: &Metrics) -> String {
    metrics.render_at(NOW.parse().unwrap())
}

#[track_caller]
fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l == *line),
            "no line {line:?} in:\n{text}"
        );
    }
}

fn gpu_node(name: &str, ready: Option<bool>) -> GpuNode {
    let mut node = testing::gpu_node(
        name,
        vec![GpuDevice {
            family: Default::default(),
            network_id: None,
            uuid: format!("GPU-{name}"),
            ..testing::gpu(0, "A100", 1000)
        }],
    );
    let status = node.status.as_mut().unwrap();
    status.conditions = ready
        .map(|ready| {
            let reason = if ready { "Registered" } else { "NotRegistered" };
            Condition {
                last_transition_time: Time(at(60)),
                ..testing::ready(ready, reason, "test")
            }
        })
        .into_iter()
        .collect();
    node
}

fn allocation(name: &str, created_ago: i64, phase: Option<&str>) -> VgpuAllocation {
    let phase = phase.map(|p| serde_json::from_value(json!(p)).unwrap());
    let allocation = testing::allocation(name, &format!("uid-{name}"), "n1")
        .namespace("ns")
        .metadata(|m| m.creation_timestamp = Some(Time(at(created_ago))))
        .container(testing::container(
            "c",
            vec![testing::slice("GPU-n1", 0, 100, 10)],
        ));
    match phase {
        Some(phase) => allocation.phase(phase).build(),
        None => allocation.build(),
    }
}

/// A preemptor's hold, read as the API server serves it (status defaulted).
fn held(name: &str, created_ago: i64) -> VgpuAllocation {
    let mut hold = allocation(name, created_ago, Some("Bound"));
    hold.spec.nomination = Some(tessera_api::v1alpha1::Nomination {
        expires_at: Time(at(-60)),
        victims: vec!["ns/victim".into()],
    });
    hold
}

fn lock(node: &str, acquired_ago: i64, ttl: i64) -> NodeLock {
    let mut lock = testing::node_lock(
        node,
        testing::pod_ref("ns", "p", "u"),
        "p",
        at(acquired_ago),
        u32::try_from(ttl).unwrap(),
    );
    lock.metadata.uid = Some(format!("lock-{node}"));
    lock
}

fn lease(name: &str, renewed_ago: i64) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "agent", "leaseDurationSeconds": 40, "renewTime": ago(renewed_ago)},
    }))
    .unwrap()
}

#[test]
fn each_gpu_node_reports_whether_its_agent_says_ready() {
    let (metrics, feeder) = setup();
    let mut relist = Vec::new();
    for (name, ready) in [("up", Some(true)), ("down", Some(false)), ("old", None)] {
        feeder.node_event(Event::Apply(gpu_node(name, ready)), &mut relist);
    }
    let text = render(&metrics);
    assert_lines(
        &text,
        &[
            "# TYPE tessera_gpu_node_ready gauge",
            "tessera_gpu_node_ready{node=\"up\"} 1",
            "tessera_gpu_node_ready{node=\"down\"} 0",
            // An agent that reports no condition is taken at its word (Filter does the same).
            "tessera_gpu_node_ready{node=\"old\"} 1",
            "tessera_gpu_nodes 3",
        ],
    );
    feeder.node_event(Event::Delete(gpu_node("down", Some(false))), &mut relist);
    feeder.node_event(Event::Apply(gpu_node("up", Some(false))), &mut relist);
    let text = render(&metrics);
    assert!(!text.contains("node=\"down\""), "{text}");
    assert_lines(&text, &["tessera_gpu_node_ready{node=\"up\"} 0"]);
}

#[test]
fn every_known_label_value_is_exported_from_the_start() {
    let (metrics, _feeder) = setup();
    assert_lines(
        &render(&metrics),
        &[
            "tessera_extender_request_duration_seconds_count{verb=\"bind\",outcome=\"error\"} 0",
            "tessera_extender_request_duration_seconds_count{verb=\"filter\",outcome=\"ok\"} 0",
            "tessera_bind_rollbacks_total{reason=\"lock_busy\"} 0",
            "tessera_bind_rollbacks_total{reason=\"api\"} 0",
            "tessera_allocations{phase=\"Bound\"} 0",
            "tessera_allocations{phase=\"Failed\"} 0",
        ],
    );
}

#[test]
fn agent_leases_report_their_age_and_duration() {
    let (metrics, feeder) = setup();
    let text = render(&metrics);
    assert!(!text.contains("tessera_agent_lease_age_seconds{"), "{text}");

    let mut relist = Vec::new();
    feeder.lease_event(Event::Init, &mut relist);
    for l in [
        lease("tessera-agent-fresh", 5),
        lease("tessera-agent-dead", 125),
        // The kubelet's own Lease in the same namespace.
        lease("fresh", 1),
    ] {
        feeder.lease_event(Event::InitApply(l), &mut relist);
    }
    feeder.lease_event(Event::InitDone, &mut relist);
    let text = render(&metrics);
    assert_lines(
        &text,
        &[
            "tessera_agent_lease_age_seconds{node=\"fresh\"} 5.0",
            "tessera_agent_lease_age_seconds{node=\"dead\"} 125.0",
            "tessera_agent_lease_duration_seconds{node=\"dead\"} 40",
        ],
    );
    assert_eq!(
        text.matches("tessera_agent_lease_age_seconds{").count(),
        2,
        "{text}"
    );
    feeder.lease_event(Event::Delete(lease("tessera-agent-dead", 125)), &mut relist);
    assert!(!render(&metrics).contains("node=\"dead\""));
}

#[test]
fn the_oldest_bound_allocation_is_measured_from_its_creation() {
    let (metrics, feeder) = setup();
    assert_lines(
        &render(&metrics),
        &["tessera_allocations_bound_oldest_seconds 0.0"],
    );
    let mut relist = crate::projection::AllocationRelist::default();
    for a in [
        allocation("waiting", 90, Some("Bound")),
        allocation("just-bound", 2, Some("Bound")),
        // Older, but served or done: not waiting for the node.
        allocation("running", 600, Some("Allocated")),
        allocation("done", 900, Some("Released")),
        allocation("binding", 700, None),
        // A preemptor's hold reads Bound (the CRD's default status) but
        // waits for no node.
        held("held", 800),
    ] {
        feeder.allocation_event(Event::Apply(a), &mut relist);
    }
    let text = render(&metrics);
    assert_lines(
        &text,
        &[
            "tessera_allocations_bound_oldest_seconds 90.0",
            "tessera_allocations{phase=\"Bound\"} 2",
            "tessera_allocations{phase=\"Pending\"} 1",
            "tessera_allocations{phase=\"Held\"} 1",
        ],
    );
    feeder.allocation_event(
        Event::Apply(allocation("waiting", 90, Some("Allocated"))),
        &mut relist,
    );
    assert_lines(
        &render(&metrics),
        &["tessera_allocations_bound_oldest_seconds 2.0"],
    );
}

#[test]
fn node_locks_report_their_oldest_age_and_those_past_their_ttl() {
    let (metrics, feeder) = setup();
    assert_lines(
        &render(&metrics),
        &[
            "tessera_node_locks 0",
            "tessera_node_locks_expired 0",
            "tessera_node_lock_oldest_age_seconds 0.0",
        ],
    );
    let mut relist = Vec::new();
    // Taken 90 s ago with a 60 s TTL (expired), and 10 s ago.
    feeder.lock_event(Event::Apply(lock("stuck", 90, 60)), &mut relist);
    feeder.lock_event(Event::Apply(lock("busy", 10, 60)), &mut relist);
    assert_lines(
        &render(&metrics),
        &[
            "tessera_node_locks 2",
            "tessera_node_locks_expired 1",
            "tessera_node_lock_oldest_age_seconds 90.0",
        ],
    );
    feeder.lock_event(Event::Delete(lock("stuck", 90, 60)), &mut relist);
    assert_lines(
        &render(&metrics),
        &[
            "tessera_node_locks 1",
            "tessera_node_locks_expired 0",
            "tessera_node_lock_oldest_age_seconds 10.0",
        ],
    );
}

#[test]
fn webhook_reviews_are_counted_by_outcome() {
    let (metrics, _feeder) = setup();
    assert_lines(
        &render(&metrics),
        &[
            "# TYPE tessera_webhook_requests counter",
            "tessera_webhook_requests_total{outcome=\"allowed\"} 0",
            "tessera_webhook_requests_total{outcome=\"mutated\"} 0",
            "tessera_webhook_requests_total{outcome=\"denied\"} 0",
            "tessera_webhook_requests_total{outcome=\"error\"} 0",
        ],
    );
    metrics.webhook.count(crate::webhook::Outcome::Mutated);
    metrics.webhook.count(crate::webhook::Outcome::Mutated);
    metrics.webhook.count(crate::webhook::Outcome::Error);
    assert_lines(
        &render(&metrics),
        &[
            "tessera_webhook_requests_total{outcome=\"mutated\"} 2",
            "tessera_webhook_requests_total{outcome=\"error\"} 1",
        ],
    );
}

#[test]
fn a_gpu_pod_waits_until_it_has_an_allocation() {
    let (metrics, feeder) = setup();
    let waiting = metrics.projection.waiting();
    // Filter found no GPU for a (since 15 minutes) and b (since 1 minute),
    // and for c, whose preemption holds slices for it (not placed yet).
    waiting.unfit(
        "uid-a",
        "ns",
        "a",
        vec![("n1".into(), crate::engine::Lack::Memory)],
        at(900),
    );
    waiting.unfit(
        "uid-a",
        "ns",
        "a",
        vec![("n1".into(), crate::engine::Lack::Memory)],
        at(60),
    );
    waiting.unfit("uid-b", "ns", "b", vec![], at(60));
    waiting.unfit(
        "uid-c",
        "ns",
        "c",
        vec![("n1".into(), crate::engine::Lack::Slice)],
        at(60),
    );
    let mut relist = crate::projection::AllocationRelist::default();
    feeder.allocation_event(Event::Apply(held("c", 30)), &mut relist);
    assert_lines(
        &render(&metrics),
        &[
            r#"tessera_gpu_pod_waiting_seconds{namespace="ns",pod="a",lack="memory"} 900.0"#,
            r#"tessera_gpu_pod_waiting_seconds{namespace="ns",pod="b",lack="other"} 60.0"#,
            r#"tessera_gpu_pod_waiting_seconds{namespace="ns",pod="c",lack="slice"} 60.0"#,
        ],
    );
    // a is placed (through whichever replica: its allocation is watched).
    feeder.allocation_event(Event::Apply(allocation("a", 1, Some("Bound"))), &mut relist);
    let text = render(&metrics);
    assert!(!text.contains(r#"pod="a""#), "{text}");
    assert_lines(
        &text,
        &[r#"tessera_gpu_pod_waiting_seconds{namespace="ns",pod="b",lack="other"} 60.0"#],
    );
}
