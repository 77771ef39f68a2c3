//! `NodeLock`: who the node agent serves next on a node.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::{SignedDuration, Timestamp},
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The longest a NodeLock may be held, in seconds.
pub const MAX_LOCK_TTL_SECONDS: u32 = 300;

/// Serializes the window between binding a GPU pod to a node and the kubelet's
/// `Allocate` call for it. Cluster-scoped, named after the node.
///
/// The kubelet's `Allocate` carries no pod identity, so at most one GPU pod per
/// node may be in that window: the scheduler creates the lock before binding,
/// and the node agent reads it to find the pod it serves, then deletes it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "NodeLock",
    plural = "nodelocks",
    shortname = "nlock",
    category = "tessera",
    derive = "PartialEq",
    doc = "Marks the one GPU pod a node's agent serves next, between binding and the kubelet's Allocate call. Deleted when served; expires after ttlSeconds.",
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
}

impl NodeLock {
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
            },
        }
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
