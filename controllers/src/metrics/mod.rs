//! Prometheus metrics of the controller (prometheus-client), served at
//! `/metrics` beside `/healthz` and `/readyz` (see [`endpoints`]).
//!
//! Each component defines and registers its own counters and histograms,
//! updated as requests happen (`extender::ExtenderMetrics`,
//! `webhook::WebhookMetrics`); [`Metrics`] holds the registry, those, and
//! the projection's gauges, which are set at scrape time from the
//! projection (nodes, allocations, NodeLocks, agent Leases), so they are
//! never older than the watches; so are HAMi's device quota gauges
//! (`hami_resource_quota_used`, `hami_resource_quota_limit`, unprefixed
//! for HAMi's dashboards). Every replica
//! exports the gauges from its own watches: aggregate them with `max` or
//! `min`, not `sum`. docs/configuration.md lists every metric.

mod endpoints;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, atomic::AtomicU64};

use k8s_openapi::jiff::Timestamp;
use prometheus_client::{
    encoding::{
        EncodeLabelSet,
        text::{encode_eof, encode_registry},
    },
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use tessera_scheduling::request::RequestConfig;

use crate::{
    extender::ExtenderMetrics,
    projection::{Projection, seconds_since},
    webhook::WebhookMetrics,
};

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

/// Labels of a per-pod series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// What the nodes lacked most for it: `slice`, `memory`, `cores`, or
    /// `other` (a type, a quota, a node not ready, ...).
    pub lack: &'static str,
}

/// Labels of a tuning advice.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdviceLabels {
    /// The pool: a GpuNodeConfig's name, or `node/<name>`.
    pub pool: String,
    /// What to change: `deviceMemoryScaling`, `deviceSplitCount`,
    /// `gpucores` or `nodes`.
    pub setting: String,
    /// The current value ("" where none).
    pub from: String,
    /// The advised value ("" where none).
    pub to: String,
}

/// Labels of a per-pool series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool: a GpuNodeConfig's name, or `node/<name>`.
    pub pool: String,
}

/// Labels of HAMi's quota limit gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    /// The namespace.
    pub namespace: String,
    /// The device resource (`nvidia.com/gpumem`).
    pub quota_name: String,
}

/// Labels of HAMi's quota usage gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaUsedLabels {
    /// The namespace.
    pub namespace: String,
    /// The device resource (`nvidia.com/gpumem`).
    pub quota_name: String,
    /// The limit, in the resource's unit.
    pub limit: String,
}

/// A gauge of seconds.
type Seconds = Gauge<f64, AtomicU64>;
/// A percentage gauge.
type Percent = Gauge<f64, AtomicU64>;

/// The allocation phases, each exported (0 when none is in it).
const PHASES: [&str; 5] = ["Pending", "Bound", "Allocated", "Released", "Failed"];

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// HAMi's series, under HAMi's names (no prefix).
    hami: Mutex<Registry>,
    /// The extender's, registered by it.
    pub extender: ExtenderMetrics,
    /// The webhook's, registered by it.
    pub webhook: WebhookMetrics,
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
    /// NodeLocks held (their holder not served yet).
    pub node_locks: Gauge,
    /// Held NodeLocks past their expiry.
    pub node_locks_expired: Gauge,
    /// Seconds since the oldest held NodeLock was taken.
    pub node_lock_oldest: Seconds,
    /// Per GPU pod Filter found no node for, seconds since its first such
    /// answer (set at scrape time).
    pub gpu_pod_waiting: Family<PodLabels, Seconds>,
    /// Per pool and advice, 1 (the leader's last advice).
    pub tuning_advice: Family<AdviceLabels, Gauge>,
    /// Per pool, the window's p95 of memory use over limits, percent.
    pub tuning_memory_p95: Family<PoolLabels, Percent>,
    /// Per pool, the window's p95 of compute use over limits, percent.
    pub tuning_compute_p95: Family<PoolLabels, Percent>,
    /// Per namespace and device resource, what its pods hold, in the
    /// resource's unit (HAMi's `hami_resource_quota_used`).
    pub quota_used: Family<QuotaUsedLabels, Gauge>,
    /// Per namespace and device resource, its limit (HAMi's
    /// `hami_resource_quota_limit`).
    pub quota_limit: Family<QuotaLabels, Gauge>,
    projection: Projection,
    request: RequestConfig,
}

impl Metrics {
    /// Registers every metric under the `tessera_` prefix: each
    /// component's, then the projection's gauges; and HAMi's quota gauges,
    /// with resource names from `request`.
    pub fn new(projection: Projection, request: RequestConfig) -> Arc<Self> {
        let mut registry = Registry::with_prefix("tessera");
        let extender = ExtenderMetrics::register(&mut registry);
        let webhook = WebhookMetrics::register(&mut registry);
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
        registry.register(
            "node_locks",
            "NodeLocks held: their holder's allocation not yet served",
            node_locks.clone(),
        );
        let node_locks_expired = Gauge::default();
        registry.register(
            "node_locks_expired",
            "Held NodeLocks past their expiry (acquiredAt + ttlSeconds)",
            node_locks_expired.clone(),
        );
        let node_lock_oldest = Seconds::default();
        registry.register(
            "node_lock_oldest_age_seconds",
            "Seconds since the oldest held NodeLock was taken (0 when none is held)",
            node_lock_oldest.clone(),
        );
        let gpu_pod_waiting = Family::<PodLabels, Seconds>::default();
        registry.register(
            "gpu_pod_waiting_seconds",
            "Per GPU pod this replica's Filter found no GPU for: seconds since the first such answer (gone once it fits, is placed, or has not been asked about for 10 minutes)",
            gpu_pod_waiting.clone(),
        );
        let tuning_advice = Family::<AdviceLabels, Gauge>::default();
        registry.register(
            "tuning_advice",
            "1 per piece of the tuning guide's advice for a pool of GPU nodes (a GpuNodeConfig's, or one node's), from the leader's last round; its evidence is in the config's status.tuning",
            tuning_advice.clone(),
        );
        let tuning_memory_p95 = Family::<PoolLabels, Percent>::default();
        registry.register(
            "tuning_memory_used_p95_percent",
            "Per pool, the 95th percentile over the tuning window of the memory its containers held over their limits, percent (the leader's)",
            tuning_memory_p95.clone(),
        );
        let tuning_compute_p95 = Family::<PoolLabels, Percent>::default();
        registry.register(
            "tuning_compute_used_p95_percent",
            "Per pool, the 95th percentile over the tuning window of the compute its measured containers used over their limits, percent (the leader's)",
            tuning_compute_p95.clone(),
        );
        let mut hami = Registry::default();
        let quota_used = Family::<QuotaUsedLabels, Gauge>::default();
        hami.register(
            "hami_resource_quota_used",
            "resourcequota usage for a certain device",
            quota_used.clone(),
        );
        let quota_limit = Family::<QuotaLabels, Gauge>::default();
        hami.register(
            "hami_resource_quota_limit",
            "resourcequota limit for a certain device",
            quota_limit.clone(),
        );
        Arc::new(Self {
            registry: Mutex::new(registry),
            hami: Mutex::new(hami),
            extender,
            webhook,
            allocations,
            gpu_nodes,
            gpu_node_ready,
            agent_lease_age,
            agent_lease_duration,
            bound_oldest,
            node_locks,
            node_locks_expired,
            node_lock_oldest,
            gpu_pod_waiting,
            tuning_advice,
            tuning_memory_p95,
            tuning_compute_p95,
            quota_used,
            quota_limit,
            projection,
            request,
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
        let hami = self.hami.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh(now);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut text, &registry);
        let _ = encode_registry(&mut text, &hami);
        let _ = encode_eof(&mut text);
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
        let placed = self.projection.placed_pods();
        self.gpu_pod_waiting.clear();
        for wait in self
            .projection
            .waiting()
            .at(now, |uid| placed.contains(uid))
        {
            self.gpu_pod_waiting
                .get_or_create(&PodLabels {
                    namespace: wait.namespace,
                    pod: wait.name,
                    lack: wait.lack.map_or("other", crate::engine::Lack::as_str),
                })
                .set(seconds_since(wait.since, now));
        }
        self.tuning_advice.clear();
        self.tuning_memory_p95.clear();
        self.tuning_compute_p95.clear();
        for pool in self.projection.tuning() {
            let name = pool.pool.name.clone();
            for advice in &pool.advice {
                let advice = crate::tuning::describe(advice, &pool);
                self.tuning_advice
                    .get_or_create(&AdviceLabels {
                        pool: name.clone(),
                        setting: advice.setting,
                        from: advice.from.unwrap_or_default(),
                        to: advice.to.unwrap_or_default(),
                    })
                    .set(1);
            }
            let labels = PoolLabels { pool: name };
            if let Some(p95) = pool.observed.memory_p95 {
                self.tuning_memory_p95.get_or_create(&labels).set(p95);
            }
            if let Some(p95) = pool.observed.compute_p95 {
                self.tuning_compute_p95.get_or_create(&labels).set(p95);
            }
        }
        self.quota_used.clear();
        self.quota_limit.clear();
        for (namespace, limits, used) in self.projection.quota_usage(&self.request) {
            for (resource, limit) in limits {
                let held = used.get(&resource).copied().unwrap_or(0);
                let labels = QuotaLabels {
                    namespace: namespace.clone(),
                    quota_name: resource,
                };
                self.quota_used
                    .get_or_create(&QuotaUsedLabels {
                        namespace: labels.namespace.clone(),
                        quota_name: labels.quota_name.clone(),
                        limit: limit.hard.to_string(),
                    })
                    .set(count_u64(crate::engine::quota::in_units(held, limit.unit)));
                self.quota_limit
                    .get_or_create(&labels)
                    .set(count_u64(limit.hard));
            }
        }
    }
}

fn count_u64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
