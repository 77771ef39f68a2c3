//! The owner reference of the Node's dependents.

use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::Resource;

/// The owner reference a Node's dependents (its GpuNode, its ResourceSlice)
/// carry: not as controller, so the Node's own controllers ignore them.
pub fn owner_of(node: &Node) -> Option<OwnerReference> {
    node.controller_owner_ref(&()).map(|mut o| {
        o.controller = Some(false);
        o
    })
}
