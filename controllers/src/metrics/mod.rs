//! Prometheus metrics of the controller (prometheus-client), served at
//! `/metrics` beside `/healthz` and `/readyz` (see [`endpoints`]).
//!
//! Counters and histograms are updated as requests happen; the gauges are
//! set at scrape time from the projection (nodes, allocations, NodeLocks,
//! agent Leases), so they are never older than the watches. Every replica
//! exports the gauges from its own watches: aggregate them with `max` or
//! `min`, not `sum`. docs/configuration.md lists every metric.

mod endpoints;

/// How the admission webhook answered a review (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// Admitted unchanged (not a GPU pod).
    Allowed,
    /// A GPU pod admitted with a patch (defaults, scheduler).
    Mutated,
    /// Refused: the pod's GPU request breaks a rule.
    Denied,
    /// The review could not be answered (unreadable, or no patch could be made).
    Error,
}

impl WebhookOutcome {
    /// Every outcome, so the counter of each starts at zero.
    pub const ALL: [Self; 4] = [Self::Allowed, Self::Mutated, Self::Denied, Self::Error];

    /// The `outcome` label of `tessera_webhook_requests_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Mutated => "mutated",
            Self::Denied => "denied",
            Self::Error => "error",
        }
    }
}

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, atomic::AtomicU64};

use k8s_openapi::jiff::Timestamp;
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::projection::{Projection, seconds_since};

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

/// Labels of a per-node series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// The node's name.
    pub node: String,
}

/// Labels of an admission review's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `allowed`, `mutated`, `denied` or `error` (see [`WebhookOutcome`]).
    pub outcome: &'static str,
}

/// A gauge of seconds.
type Seconds = Gauge<f64, AtomicU64>;

/// The extender's verbs and their outcomes, exported from the start.
const VERBS: [&str; 3] = ["filter", "prioritize", "bind"];
const VERB_OUTCOMES: [&str; 2] = ["ok", "error"];

/// The allocation phases, each exported (0 when none is in it).
const PHASES: [&str; 5] = ["Pending", "Bound", "Allocated", "Released", "Failed"];

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
    /// Admission reviews answered, by outcome.
    pub webhook_requests: Family<OutcomeLabels, Counter>,
    /// Allocations by phase, from the projection (set at scrape time).
    pub allocations: Family<PhaseLabels, Gauge>,
    /// GPU nodes known to the projection (set at scrape time).
    pub gpu_nodes: Gauge,
    /// Per GPU node, 1 when its agent says it takes pods (set at scrape time).
    pub gpu_node_ready: Family<NodeLabels, Gauge>,
    /// Per agent Lease, seconds since its last renewal (set at scrape time).
    pub agent_lease_age: Family<NodeLabels, Seconds>,
    /// Per agent Lease, its `leaseDurationSeconds` (set at scrape time).
    pub agent_lease_duration: Family<NodeLabels, Gauge>,
    /// Seconds since the oldest allocation still `Bound` was created.
    pub bound_oldest: Seconds,
    /// NodeLocks that exist.
    pub node_locks: Gauge,
    /// NodeLocks past their expiry.
    pub node_locks_expired: Gauge,
    /// Seconds since the oldest NodeLock was taken.
    pub node_lock_oldest: Seconds,
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
        let webhook_requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Admission reviews answered by the webhook, by outcome",
            webhook_requests.clone(),
        );
        let allocations = Family::<PhaseLabels, Gauge>::default();
        registry.register(
            "allocations",
            "VgpuAllocations by phase",
            allocations.clone(),
        );
        let gpu_nodes = Gauge::default();
        registry.register("gpu_nodes", "Nodes with a GpuNode", gpu_nodes.clone());
        let gpu_node_ready = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "gpu_node_ready",
            "1 while the node's agent reports its GpuNode Ready (GPU pods may go there), 0 when not",
            gpu_node_ready.clone(),
        );
        let agent_lease_age = Family::<NodeLabels, Seconds>::default();
        registry.register(
            "agent_lease_age_seconds",
            "Seconds since the node agent last renewed its Lease",
            agent_lease_age.clone(),
        );
        let agent_lease_duration = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "agent_lease_duration_seconds",
            "How long the node agent's Lease counts as held without renewal",
            agent_lease_duration.clone(),
        );
        let bound_oldest = Seconds::default();
        registry.register(
            "allocations_bound_oldest_seconds",
            "Seconds since the oldest VgpuAllocation still in phase Bound was created (0 when none is)",
            bound_oldest.clone(),
        );
        let node_locks = Gauge::default();
        registry.register("node_locks", "NodeLocks that exist", node_locks.clone());
        let node_locks_expired = Gauge::default();
        registry.register(
            "node_locks_expired",
            "NodeLocks past their expiry (acquiredAt + ttlSeconds) that still exist",
            node_locks_expired.clone(),
        );
        let node_lock_oldest = Seconds::default();
        registry.register(
            "node_lock_oldest_age_seconds",
            "Seconds since the oldest NodeLock was taken (0 without locks)",
            node_lock_oldest.clone(),
        );
        // Every label value known in advance starts at zero, so a series
        // exists (and rate() sees its first increase) before anything happened.
        for verb in VERBS {
            for outcome in VERB_OUTCOMES {
                verb_seconds.get_or_create_owned(&VerbLabels { verb, outcome });
            }
        }
        for reason in crate::Error::METRIC_LABELS {
            bind_rollbacks.get_or_create_owned(&ReasonLabels { reason });
        }
        for outcome in WebhookOutcome::ALL {
            webhook_requests.get_or_create_owned(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        Arc::new(Self {
            registry: Mutex::new(registry),
            verb_seconds,
            lock_wait_seconds,
            bind_rollbacks,
            webhook_requests,
            allocations,
            gpu_nodes,
            gpu_node_ready,
            agent_lease_age,
            agent_lease_duration,
            bound_oldest,
            node_locks,
            node_locks_expired,
            node_lock_oldest,
            projection,
        })
    }

    /// The text exposition of every metric, the gauges as of now.
    pub fn render(&self) -> String {
        self.render_at(Timestamp::now())
    }

    /// The text exposition of every metric, the gauges as of `now`.
    pub fn render_at(&self, now: Timestamp) -> String {
        // Held while the gauges are refreshed, so concurrent scrapes do not
        // interleave clearing and filling the per-node families.
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh(now);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }

    /// Sets the gauges from the projection.
    fn refresh(&self, now: Timestamp) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.allocations.clear();
        for phase in PHASES {
            self.allocations
                .get_or_create(&PhaseLabels {
                    phase: phase.to_owned(),
                })
                .set(0);
        }
        for (phase, n) in self.projection.phase_counts() {
            self.allocations
                .get_or_create(&PhaseLabels { phase })
                .set(count(n));
        }
        {
            let ledger = self.projection.read();
            self.gpu_nodes.set(count(ledger.node_count()));
            self.gpu_node_ready.clear();
            for (node, ready) in ledger.readiness() {
                self.gpu_node_ready
                    .get_or_create(&NodeLabels {
                        node: node.to_owned(),
                    })
                    .set(i64::from(ready));
            }
        }
        self.agent_lease_age.clear();
        self.agent_lease_duration.clear();
        for (node, lease) in self.projection.agent_leases() {
            let labels = NodeLabels { node };
            if let Some(renewed) = lease.renewed {
                self.agent_lease_age
                    .get_or_create(&labels)
                    .set(seconds_since(renewed, now));
            }
            if let Some(duration) = lease.duration_seconds {
                self.agent_lease_duration
                    .get_or_create(&labels)
                    .set(i64::from(duration));
            }
        }
        self.bound_oldest
            .set(self.projection.bound_oldest_seconds(now));
        let locks = self.projection.lock_ages(now);
        self.node_locks.set(count(locks.count));
        self.node_locks_expired.set(count(locks.expired));
        self.node_lock_oldest.set(locks.oldest_age_seconds);
    }

    /// Counts one admission review by its outcome label.
    pub fn count_review(&self, outcome: &'static str) {
        self.webhook_requests
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}
