/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A background loop ended while the controller ran.
    #[error("the controller's {name} loop {how}; stopping so that it is restarted")]
    LoopEnded {
        /// The loop.
        name: &'static str,
        /// How it ended.
        how: String,
    },
    /// The webhook's certificate files cannot be read or used.
    #[error("webhook certificate {} / {}: {source}", cert.display(), key.display())]
    Certificate {
        /// The certificate file.
        cert: std::path::PathBuf,
        /// The private key file.
        key: std::path::PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// A Kubernetes API call failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
    /// An API call or a wait did not end in time.
    #[error("{what} did not end within {seconds} s")]
    TimedOut {
        /// What was being done.
        what: String,
        /// How long it had.
        seconds: u64,
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
    /// The pod would take its namespace past a device quota.
    #[error("pod would exceed its namespace's device quota: {reason}")]
    OverQuota {
        /// The quota, the limit, what is used and what the pod asks.
        reason: String,
    },
    /// The API server did not say whether it bound the pod (a timeout, a
    /// 5xx, a dropped connection after the request was sent) and reading the
    /// pod back did not tell either. Bind never guesses: the pod's
    /// allocation and the node's lock stay, so no other pod is served on the
    /// node meanwhile; a pod that turns out bound is served as usual, and one
    /// that is not is bound again by kube-scheduler's retry.
    #[error(
        "binding pod {pod} to node {node}: the API server did not say whether it was bound ({source}); its allocation and the node's lock are kept"
    )]
    BindingUnknown {
        /// The pod, `namespace/name`.
        pod: String,
        /// The node.
        node: String,
        /// The last error the binding or its read-back got.
        #[source]
        source: kube::Error,
    },
    /// The request refers to a pod that is not the one the scheduler meant.
    #[error("{0}")]
    Stale(String),
    /// The pod's GPU request is invalid.
    #[error(transparent)]
    Request(#[from] tessera_api::Error),
    /// A listener could not be opened or a server stopped (start-up and
    /// serving, never a scheduling decision).
    #[error("{context}: {source}")]
    Serve {
        /// What was being done.
        context: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// `--profiling` could not be served.
    #[error(transparent)]
    Profiling(#[from] tessera_profiling::Error),
}

impl Error {
    /// Every value [`Error::metric_label`] returns, so counters by reason
    /// can start at zero.
    pub const METRIC_LABELS: [&'static str; 8] = [
        "config",
        "api",
        "binding_unknown",
        "lock_busy",
        "no_longer_fits",
        "over_quota",
        "stale",
        "invalid_request",
    ];

    /// A short, stable label for metrics (one of [`Error::METRIC_LABELS`]).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Config(_)
            | Self::Certificate { .. }
            | Self::Serve { .. }
            | Self::Profiling(_)
            | Self::LoopEnded { .. } => "config",
            Self::Kube { .. } | Self::TimedOut { .. } => "api",
            Self::BindingUnknown { .. } => "binding_unknown",
            Self::LockBusy { .. } => "lock_busy",
            Self::NoLongerFits { .. } => "no_longer_fits",
            Self::OverQuota { .. } => "over_quota",
            Self::Stale(_) => "stale",
            Self::Request(_) => "invalid_request",
        }
    }

    pub(crate) fn serve(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Serve { context, source }
    }

    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_label_is_listed() {
        let errors = [
            Error::Config("x".into()),
            Error::Certificate {
                cert: "c".into(),
                key: "k".into(),
                source: std::io::Error::other("x"),
            },
            Error::LockBusy {
                node: "n".into(),
                holder: "h".into(),
                waited_ms: 1,
            },
            Error::NoLongerFits {
                node: "n".into(),
                reason: "r".into(),
            },
            Error::OverQuota { reason: "q".into() },
            Error::Stale("s".into()),
            Error::serve("listening")(std::io::Error::other("x")),
            Error::Request(tessera_api::Error::InvalidConfig {
                field: "defaultCores".into(),
                rule: "must be between 0 and 100".into(),
            }),
        ];
        for error in &errors {
            assert!(
                Error::METRIC_LABELS.contains(&error.metric_label()),
                "{error}"
            );
        }
        let source = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert!(Error::METRIC_LABELS.contains(&Error::kube("x")(source).metric_label()));
        let unknown = Error::BindingUnknown {
            pod: "d/p".into(),
            node: "n".into(),
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        };
        assert!(Error::METRIC_LABELS.contains(&unknown.metric_label()));
    }
}
