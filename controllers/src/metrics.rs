//! Prometheus metrics of the controller (prometheus-client), served at `/metrics`.

use std::sync::{Arc, Mutex};

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::projection::Projection;

/// Labels of a verb's latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// `filter`, `prioritize` or `bind`.
    pub verb: &'static str,
    /// `ok` or `error`.
    pub outcome: &'static str,
}

/// Labels of a failed bind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why: `lock_busy`, `no_longer_fits`, `stale`, `invalid_request`, `api`, `config`.
    pub reason: &'static str,
}

/// Labels of allocation counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `Bound`, `Allocated`, `Released`, `Failed`, or `Pending` before any status.
    pub phase: String,
}

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Seconds per extender call.
    pub verb_seconds: Family<VerbLabels, Histogram>,
    /// Seconds Bind spent waiting for another pod's NodeLock.
    pub lock_wait_seconds: Histogram,
    /// Binds that failed and were rolled back, by reason.
    pub bind_rollbacks: Family<ReasonLabels, Counter>,
    /// Allocations by phase, from the projection (set at scrape time).
    pub allocations: Family<PhaseLabels, Gauge>,
    /// GPU nodes known to the projection (set at scrape time).
    pub gpu_nodes: Gauge,
    projection: Projection,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0, 30.0,
    ]
    .into_iter()
}

impl Metrics {
    /// Registers every metric under the `tessera_` prefix.
    pub fn new(projection: Projection) -> Arc<Self> {
        let mut registry = Registry::with_prefix("tessera");
        let verb_seconds = Family::<VerbLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(latency_buckets())
        });
        registry.register(
            "extender_request_duration_seconds",
            "Latency of kube-scheduler extender calls",
            verb_seconds.clone(),
        );
        let lock_wait_seconds = Histogram::new(latency_buckets());
        registry.register(
            "bind_lock_wait_duration_seconds",
            "Time Bind waited for a node's NodeLock",
            lock_wait_seconds.clone(),
        );
        let bind_rollbacks = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "bind_rollbacks",
            "Binds that failed and were undone, by reason",
            bind_rollbacks.clone(),
        );
        let allocations = Family::<PhaseLabels, Gauge>::default();
        registry.register(
            "allocations",
            "VgpuAllocations by phase",
            allocations.clone(),
        );
        let gpu_nodes = Gauge::default();
        registry.register("gpu_nodes", "Nodes with a GpuNode", gpu_nodes.clone());
        Arc::new(Self {
            registry: Mutex::new(registry),
            verb_seconds,
            lock_wait_seconds,
            bind_rollbacks,
            allocations,
            gpu_nodes,
            projection,
        })
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let phases = self.projection.phase_counts();
        self.allocations.clear();
        for (phase, count) in phases {
            self.allocations
                .get_or_create(&PhaseLabels { phase })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.gpu_nodes
            .set(i64::try_from(self.projection.read().node_count()).unwrap_or(i64::MAX));
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let _ = encode(&mut text, &registry);
        text
    }

    /// `GET /metrics`.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/metrics", get(scrape))
            .with_state(self)
    }
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}
