/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A Kubernetes API call failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
    /// Bind could not take the node's lock in time.
    #[error(
        "node {node} is locked by pod {holder} (waiting for its device allocation); gave up after {waited_ms} ms"
    )]
    LockBusy {
        /// The node.
        node: String,
        /// The pod holding the lock, `namespace/name`.
        holder: String,
        /// How long Bind waited.
        waited_ms: u128,
    },
    /// The pod no longer fits the node it was assigned.
    #[error("pod no longer fits node {node}: {reason}")]
    NoLongerFits {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The request refers to a pod that is not the one the scheduler meant.
    #[error("{0}")]
    Stale(String),
    /// The pod's GPU request is invalid.
    #[error(transparent)]
    Request(#[from] tessera_api::Error),
}

impl Error {
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::Kube { .. } => "api",
            Self::LockBusy { .. } => "lock_busy",
            Self::NoLongerFits { .. } => "no_longer_fits",
            Self::Stale(_) => "stale",
            Self::Request(_) => "invalid_request",
        }
    }

    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }
}
