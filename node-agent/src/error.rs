/// Everything that can go wrong in the node agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The fake backend's device file could not be read or parsed.
    #[error("fake GPU file {path}: {message}")]
    FakeDevices {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// A setting is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// NVML failed.
    #[error("NVML: {0}")]
    Nvml(String),
    /// Creating, listing or destroying a MIG instance failed.
    #[error("MIG: {0}")]
    Mig(String),
    /// Starting or commanding an MPS control daemon failed.
    #[error("MPS: {0}")]
    Mps(String),
    /// A container could not be served in its sharing mode.
    #[error("serving a container: {0}")]
    Serving(String),
    /// The kubelet's pod-resources API could not be listed.
    #[error("the kubelet's pod-resources API at {0}")]
    PodResources(String),
    /// A DRA claim cannot be prepared as allocated.
    #[error("DRA: {0}")]
    Dra(String),
    /// `--kubeconfig` cannot be read or used.
    #[error("kubeconfig {}: {source}", .path.display())]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        #[source]
        source: kube::config::KubeconfigError,
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
    /// The kubelet's Allocate (or GetPreferredAllocation) cannot be served.
    #[error(transparent)]
    Allocate(#[from] AllocateError),
    /// A local file or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The interposer could not be installed on the host (`--install-interposer-from`).
    #[error("installing the interposer {} as {}: {action}: {source}", .from.display(), .to.display())]
    InstallInterposer {
        /// The library in the agent's image.
        from: std::path::PathBuf,
        /// Where it goes on the host (`--interposer-library`).
        to: std::path::PathBuf,
        /// The step that failed.
        action: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// gRPC transport to or from the kubelet failed.
    #[error("{context}: {source}")]
    Grpc {
        /// What was being done.
        context: String,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `--profiling` could not be served.
    #[error(transparent)]
    Profiling(#[from] tessera_profiling::Error),
    /// A background loop ended while the agent ran.
    #[error("the agent's {name} loop {how}; stopping so that the kubelet restarts the agent")]
    LoopEnded {
        /// The loop.
        name: &'static str,
        /// How it ended.
        how: String,
    },
}

impl Error {
    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }

    pub(crate) fn grpc<E: std::error::Error + Send + Sync + 'static>(
        context: impl Into<String>,
    ) -> impl FnOnce(E) -> Self {
        let context = context.into();
        move |source| Self::Grpc {
            context,
            source: Box::new(source),
        }
    }
}

/// Why Allocate cannot be served. Each message is what the kubelet shows
/// on the pod (UnexpectedAdmissionError), so it says what to check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// No NodeLock: no GPU pod is between binding and Allocate here.
    #[error(
        "node {node} has no NodeLock: no GPU pod is waiting for devices here. Either the pod was not scheduled by Tessera's scheduler (schedulerName tessera-scheduler, which locks the node before binding), or its lock was released before the kubelet asked (it expired, or the pod was deleted); delete the pod so it is scheduled again"
    )]
    NoLock {
        /// The node.
        node: String,
    },
    /// The lock names a pod whose allocation is missing or belongs to another pod.
    #[error("NodeLock {node} names pod {pod} but its VgpuAllocation {detail}")]
    NoAllocation {
        /// The node.
        node: String,
        /// `namespace/name` of the lock holder.
        pod: String,
        /// What is wrong.
        detail: String,
    },
    /// Every container of the lock's holder has been served already: the
    /// lock is free, and no pod Tessera bound is waiting here.
    #[error(
        "the NodeLock is free: its last holder, pod {pod}, was served ({served}), and no GPU pod is waiting for devices here. Either the pod asking was not scheduled by Tessera's scheduler (schedulerName tessera-scheduler, which locks the node before binding), or its lock was released before the kubelet asked (it expired, or the pod was deleted), or the kubelet asked again for pod {pod}; delete the pod so it is scheduled again"
    )]
    AlreadyServed {
        /// `namespace/name` of the lock's last holder.
        pod: String,
        /// The containers served.
        served: String,
    },
    /// The NodeLock's `expiresAt` is past: the node may be handed to
    /// another pod at any moment, so the pod asking may not be the holder.
    #[error(
        "NodeLock {lock} held by pod {holder} expired at {expired} (now {now}): the node may already be another pod's, so the pod asking cannot be told to be its holder; refusing. Delete the pod so it is scheduled again"
    )]
    LockExpired {
        /// The lock (= node) name.
        lock: String,
        /// `namespace/name (UID uid)` of the holder.
        holder: String,
        /// Its `expiresAt`.
        expired: String,
        /// The agent's clock.
        now: String,
    },
    /// The NodeLock's holder is not the pod of its UID bound to this node.
    #[error(
        "NodeLock {lock} names pod {holder}, but {reason}: the lock does not name a pod waiting for devices on this node; refusing"
    )]
    HolderNotHere {
        /// The lock (= node) name.
        lock: String,
        /// `namespace/name (UID uid)` of the holder.
        holder: String,
        /// What is wrong.
        reason: String,
    },
    /// The agent's record of the containers it answered was unusable when
    /// it started, and the lock's holder has several containers waiting:
    /// which of them an earlier agent answered is unknown.
    #[error(
        "NodeLock holder {holder} has {waiting} containers waiting for devices, and this agent cannot tell which of them it answered before it restarted (its record of answered containers was unusable: {why}); refusing rather than handing one container another's slice. Delete the pod so it is scheduled again"
    )]
    ServedUnknown {
        /// `namespace/name (UID uid)` of the lock's holder.
        holder: String,
        /// Its containers with devices not recorded as served.
        waiting: usize,
        /// Why the record was unusable.
        why: String,
    },
    /// The kubelet asks for a different number of devices than the allocation holds.
    #[error(
        "pod {pod} container {container}: the kubelet asks for {requested} device(s) but the allocation holds {allocated}"
    )]
    CountMismatch {
        /// `namespace/name`.
        pod: String,
        /// The container.
        container: String,
        /// Device IDs in the request.
        requested: usize,
        /// Devices in the allocation.
        allocated: usize,
    },
}
