//! The extender's metrics, defined and registered here
//! ([`ExtenderMetrics::register`]) into the controller's registry
//! (`crate::metrics`), as each component owns its own.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

/// Labels of a verb's latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// `filter`, `prioritize`, `bind` or `preempt`.
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

/// The extender's verbs and their outcomes, exported from the start.
const VERBS: [&str; 4] = ["filter", "prioritize", "bind", "preempt"];
/// Where a preemption was decided: after Filter, or in the preempt verb.
const PREEMPTION_PATHS: [&str; 2] = ["filter", "verb"];
const VERB_OUTCOMES: [&str; 2] = ["ok", "error"];

fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0, 30.0,
    ]
    .into_iter()
}

/// What the extender counts as requests happen.
#[derive(Clone, Debug)]
pub struct ExtenderMetrics {
    /// Seconds per extender call.
    pub verb_seconds: Family<VerbLabels, Histogram>,
    /// Seconds Bind spent waiting for another pod's NodeLock.
    pub lock_wait_seconds: Histogram,
    /// Binds that failed and were rolled back, by reason.
    pub bind_rollbacks: Family<ReasonLabels, Counter>,
    /// Preemptions that held slices for a pod, by where they were decided.
    pub preemptions: Family<PathLabels, Counter>,
    /// Pods displaced by device-aware preemption.
    pub preemption_victims: Counter,
    /// Seconds the preemption decision took over the nodes offered.
    pub preemption_decision_seconds: Histogram,
    /// Binds that asked the API server for the node's allocations because
    /// their own watch had not delivered their allocation in time.
    pub bind_rechecks_listed: Counter,
}

/// Labels of a preemption.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    /// `filter` (the extender preempted after Filter found no node) or
    /// `verb` (kube-scheduler asked the preempt verb).
    pub path: &'static str,
}

impl ExtenderMetrics {
    /// Registers the extender's metrics in `registry`, every label value
    /// known in advance at zero (so a series exists, and `rate()` sees its
    /// first increase, before anything happened).
    pub fn register(registry: &mut Registry) -> Self {
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
        for verb in VERBS {
            for outcome in VERB_OUTCOMES {
                verb_seconds.get_or_create_owned(&VerbLabels { verb, outcome });
            }
        }
        for reason in crate::Error::METRIC_LABELS {
            bind_rollbacks.get_or_create_owned(&ReasonLabels { reason });
        }
        let preemptions = Family::<PathLabels, Counter>::default();
        registry.register(
            "preemptions",
            "Device-aware preemptions that held freed GPU slices for a pod",
            preemptions.clone(),
        );
        for path in PREEMPTION_PATHS {
            preemptions.get_or_create_owned(&PathLabels { path });
        }
        let preemption_victims = Counter::default();
        registry.register(
            "preemption_victims",
            "Pods displaced by device-aware preemption",
            preemption_victims.clone(),
        );
        let preemption_decision_seconds = Histogram::new(latency_buckets());
        registry.register(
            "preemption_decision_duration_seconds",
            "Time the device-aware preemption decision took over the nodes offered",
            preemption_decision_seconds.clone(),
        );
        let bind_rechecks_listed = Counter::default();
        registry.register(
            "bind_rechecks_listed",
            "Binds that listed the node's allocations from the API server because the controller's watch lagged",
            bind_rechecks_listed.clone(),
        );
        Self {
            bind_rechecks_listed,
            verb_seconds,
            lock_wait_seconds,
            bind_rollbacks,
            preemptions,
            preemption_victims,
            preemption_decision_seconds,
        }
    }

    /// Observes one call of `verb` that took `seconds`.
    pub fn observe(&self, verb: &'static str, ok: bool, seconds: f64) {
        let labels = VerbLabels {
            verb,
            outcome: if ok { "ok" } else { "error" },
        };
        self.verb_seconds.get_or_create(&labels).observe(seconds);
    }

    /// Counts one preemption decided on `path` that displaces `victims` pods.
    pub fn preempted(&self, path: &'static str, victims: usize) {
        self.preemptions.get_or_create(&PathLabels { path }).inc();
        self.preemption_victims
            .inc_by(u64::try_from(victims).unwrap_or(u64::MAX));
    }

    /// Counts one Bind that listed the node's allocations.
    pub fn recheck_listed(&self) {
        self.bind_rechecks_listed.inc();
    }

    /// Counts one Bind undone, for `reason`.
    pub fn rolled_back(&self, reason: &'static str) {
        self.bind_rollbacks
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}
