use std::path::PathBuf;

/// Everything that can go wrong while running a local control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes and etcd binaries are missing and could not be built.
    #[error("control-plane binaries unavailable: {0}")]
    Tools(String),
    /// A file or process operation failed.
    #[error("{context}: {path}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The file or binary involved.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// A component exited while it should be running.
    #[error("{name} exited ({status}); last lines of {log}:\n{tail}")]
    Exited {
        /// The component.
        name: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {seconds} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        seconds: u64,
    },
    /// Minting certificates failed.
    #[error("cannot mint test certificates")]
    Pki(#[from] rcgen::Error),
    /// A Kubernetes API call failed.
    #[error("Kubernetes API call failed")]
    Kube(#[from] kube::Error),
    /// The kubeconfig could not be loaded.
    #[error("cannot load the kubeconfig")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// A component configuration could not be read or written.
    #[error("invalid component configuration: {0}")]
    Config(String),
}

impl Error {
    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            context,
            path,
            source,
        }
    }
}
