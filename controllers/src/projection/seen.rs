//! What the projection keeps of each allocation the watch has seen (for
//! the NodeLock table and the metrics), and objects' resourceVersions.

use k8s_openapi::jiff::Timestamp;
use tessera_api::v1alpha1::{AllocationPhase, VgpuAllocation};

/// What the metrics need of an allocation the watch has seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationSeen {
    /// Its phase; `None` for slices held for a preemptor (which read
    /// `Bound` through the CRD's default status, but are not bound), and for
    /// an allocation written before the CRD defaulted its status.
    pub phase: Option<AllocationPhase>,
    /// Whether it holds slices for a preemptor (`spec.nomination`).
    pub held: bool,
    /// When Bind created it.
    pub created: Option<Timestamp>,
    /// The pod it was written for.
    pub pod_uid: String,
}

impl AllocationSeen {
    /// What the metrics need of `allocation`.
    pub fn of(allocation: &VgpuAllocation) -> Self {
        let held = allocation.spec.nomination.is_some();
        let phase = allocation.status.as_ref().and_then(|s| s.phase);
        Self {
            phase: phase.filter(|p| !(held && *p == AllocationPhase::Bound)),
            held,
            created: allocation.metadata.creation_timestamp.as_ref().map(|t| t.0),
            pod_uid: allocation.spec.pod_uid.clone(),
        }
    }

    /// The phase's name for metrics: `Held` for a preemptor's slices,
    /// `Pending` before any status.
    pub fn phase_name(&self) -> String {
        match self.phase {
            Some(phase) => format!("{phase:?}"),
            None if self.held => "Held".to_owned(),
            None => "Pending".to_owned(),
        }
    }
}

/// An object's resourceVersion as the integer etcd gives it; 0 when it is
/// not one (another storage: callers then fall back to asking the API server).
pub fn resource_version(object: &impl kube::Resource) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
