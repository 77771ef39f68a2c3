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

/// The extender's verbs and their outcomes, exported from the start.
const VERBS: [&str; 3] = ["filter", "prioritize", "bind"];
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
        Self {
            verb_seconds,
            lock_wait_seconds,
            bind_rollbacks,
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

    /// Counts one Bind undone, for `reason`.
    pub fn rolled_back(&self, reason: &'static str) {
        self.bind_rollbacks
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}
