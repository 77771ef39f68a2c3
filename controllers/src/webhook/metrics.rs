//! The webhook's metrics, defined and registered here
//! ([`WebhookMetrics::register`]) into the controller's registry
//! (`crate::metrics`), as each component owns its own.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// How the admission webhook answered a review (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted unchanged (not a GPU pod).
    Allowed,
    /// A GPU pod admitted with a patch (defaults, scheduler).
    Mutated,
    /// Refused: the pod's GPU request breaks a rule.
    Denied,
    /// The review could not be answered (unreadable, or no patch could be made).
    Error,
}

impl Outcome {
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

/// Labels of an admission review's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `allowed`, `mutated`, `denied` or `error` (see [`Outcome`]).
    pub outcome: &'static str,
}

/// What the webhook counts.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    /// Admission reviews answered, by outcome.
    pub requests: Family<OutcomeLabels, Counter>,
}

impl WebhookMetrics {
    /// Registers the webhook's metrics in `registry`, each outcome at zero.
    pub fn register(registry: &mut Registry) -> Self {
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Admission reviews answered by the webhook, by outcome",
            requests.clone(),
        );
        for outcome in Outcome::ALL {
            requests.get_or_create_owned(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        Self { requests }
    }

    /// An unregistered set, for a webhook whose metrics nobody scrapes
    /// (tests).
    pub fn unregistered() -> Self {
        Self::register(&mut Registry::default())
    }

    /// Counts one review answered with `outcome`.
    pub fn count(&self, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }
}
