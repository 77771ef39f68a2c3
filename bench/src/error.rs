//! What can go wrong in a scale run.

/// An error of the scale bench, naming what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Starting or driving the local cluster failed.
    #[error(transparent)]
    Cluster(#[from] tessera_e2e::Error),
    /// An API request failed.
    #[error("{what}: {source}")]
    Kube {
        /// What the request was for.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Publishing a simulated node's GpuNode failed.
    #[error("publishing the GpuNode of {node}: {source}")]
    Publish {
        /// The simulated node.
        node: String,
        /// The agent publisher's error.
        #[source]
        source: tessera_node_agent::Error,
    },
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The cluster did not reach a state in time.
    #[error("timed out after {seconds} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        seconds: u64,
    },
    /// A scrape or a measurement could not be read.
    #[error("measuring {what}: {why}")]
    Measure {
        /// What was measured.
        what: String,
        /// Why it failed.
        why: String,
    },
}

impl Error {
    /// Wraps a client error with what the request was for.
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| Self::Kube { what, source }
    }

    /// Wraps an I/O error with what was done to which file.
    pub fn io(
        what: &'static str,
        path: impl std::fmt::Display,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_string();
        move |source| Self::Io { what, path, source }
    }
}
