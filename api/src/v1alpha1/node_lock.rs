//! `NodeLock`: who the node agent serves next on a node.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::{SignedDuration, Timestamp},
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::vgpu_allocation::{AllocationPhase, VgpuAllocation};

/// The longest a NodeLock may be held, in seconds.
pub const MAX_LOCK_TTL_SECONDS: u32 = 300;

/// Serializes the window between binding a GPU pod to a node and the kubelet's
/// `Allocate` call for it. Cluster-scoped, named after the node.
///
/// The kubelet's `Allocate` carries no pod identity, so at most one GPU pod per
/// node may be in that window: the scheduler takes the lock before binding,
/// and the node agent reads it to find the pod it serves. The object stays
/// from one pod to the next: it is held while its holder waits for devices,
/// and the node agent's `Allocated` write on the holder's VgpuAllocation
/// releases it ([`NodeLock::released_by`]); the next Bind takes it by
/// updating it in place, conditional on the version it judged free. A lock
/// whose holder went away or that expired unserved is deleted by the
/// lifecycle controller.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "NodeLock",
    plural = "nodelocks",
    shortname = "nlock",
    category = "tessera",
    derive = "PartialEq",
    doc = "Marks the one GPU pod a node's agent serves next, between binding and the kubelet's Allocate call. Held until the holder's VgpuAllocation is Allocated (the object then stays, free, for the node's next pod); expires after ttlSeconds.",
    printcolumn(
        name = "Holder",
        type_ = "string",
        json_path = ".spec.holder.name",
        description = "The pod holding the lock"
    ),
    printcolumn(
        name = "Holder-Namespace",
        type_ = "string",
        json_path = ".spec.holder.namespace",
        description = "The holder pod's namespace"
    ),
    printcolumn(
        name = "Expires",
        type_ = "string",
        json_path = ".spec.expiresAt",
        description = "When the lock lapses if nobody releases it"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.expiresAt - self.acquiredAt).getSeconds() == self.ttlSeconds").message("expiresAt must equal acquiredAt + ttlSeconds"))]
pub struct NodeLockSpec {
    /// The pod the node agent serves next.
    pub holder: PodReference,
    /// Name of the holder's VgpuAllocation, in the holder's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub allocation: String,
    /// When the holder acquired (or last renewed) the lock.
    pub acquired_at: Time,
    /// How long the lock lives without being released, from 1 to 300 seconds.
    #[schemars(range(min = 1, max = 300))]
    pub ttl_seconds: u32,
    /// `acquiredAt + ttlSeconds`: after this anyone may take the lock over.
    pub expires_at: Time,
    /// Taken by the node's own agent as it stops (`holder` then names the
    /// agent and its Lease, not a pod, and `allocation` is that Lease's
    /// name): no GPU pod is bound here until the agent starts again, which
    /// deletes the lock, or the lock expires.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

impl NodeLock {
    /// Whether the holder's allocation (the VgpuAllocation the lock names),
    /// written for pod `pod_uid` and in `phase`, releases the lock: it is of
    /// the holder, and past `Bound` (the node agent served every container,
    /// or it was released). A lock is held from the moment Bind takes it
    /// until then, unless it expires or its holder goes away.
    pub fn released_by(&self, pod_uid: &str, phase: Option<AllocationPhase>) -> bool {
        pod_uid == self.spec.holder.uid && phase.is_some_and(|p| p != AllocationPhase::Bound)
    }

    /// Whether the lock is held, among `allocations` (those that exist):
    /// none of them is the holder's and releases it ([`Self::released_by`]).
    pub fn held_among(&self, allocations: &[VgpuAllocation]) -> bool {
        !allocations.iter().any(|a| {
            a.metadata.name.as_deref() == Some(self.spec.allocation.as_str())
                && a.metadata.namespace.as_deref() == Some(self.spec.holder.namespace.as_str())
                && self.released_by(&a.spec.pod_uid, a.status.as_ref().and_then(|s| s.phase))
        })
    }

    /// The lock of `node` naming `holder` (whose allocation is
    /// `allocation`), acquired at `now` in whole seconds (as the API server
    /// stores times) and valid for `ttl_seconds`.
    pub fn held(
        node: &str,
        holder: &PodReference,
        allocation: &str,
        ttl_seconds: u32,
        now: Timestamp,
    ) -> NodeLock {
        let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
        let expires = now
            .checked_add(SignedDuration::from_secs(i64::from(ttl_seconds)))
            .unwrap_or(now);
        NodeLock {
            metadata: ObjectMeta {
                name: Some(node.to_owned()),
                ..Default::default()
            },
            spec: NodeLockSpec {
                holder: holder.clone(),
                allocation: allocation.to_owned(),
                acquired_at: Time(now),
                ttl_seconds,
                expires_at: Time(expires),
                draining: false,
            },
        }
    }

    /// The lock a stopping agent (`agent`, its Lease named `lease`) takes
    /// on its own `node` at `now`, for `ttl_seconds` (see
    /// [`NodeLockSpec::draining`]).
    pub fn draining(
        node: &str,
        agent: &PodReference,
        lease: &str,
        ttl_seconds: u32,
        now: Timestamp,
    ) -> NodeLock {
        let mut lock = NodeLock::held(node, agent, lease, ttl_seconds, now);
        lock.spec.draining = true;
        lock
    }
}

/// Identifies one incarnation of a pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodReference {
    /// The pod's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The pod's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The pod's UID.
    #[schemars(length(min = 1, max = 64))]
    pub uid: String,
}
