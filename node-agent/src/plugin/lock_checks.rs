//! Whether a NodeLock may still be served, checked by Allocate once
//! [`super::grant`] has chosen the container: refused when it lapsed, or
//! when its holder is not the pod of the lock's UID bound to this node.
//! Pure: no I/O; the caller reads the holder pod and the clock.

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use tessera_api::v1alpha1::NodeLock;

use crate::error::AllocateError;

/// `namespace/name (uid)` of the lock's holder.
pub(crate) fn holder(lock: &NodeLock) -> String {
    let h = &lock.spec.holder;
    format!("{}/{} (UID {})", h.namespace, h.name, h.uid)
}

/// The lock's name (= the node's).
fn lock_name(lock: &NodeLock) -> String {
    lock.metadata.name.clone().unwrap_or_default()
}

/// Refuses a lock whose `expiresAt` is before `now`: the lifecycle
/// controller may delete it and the scheduler may hand the node to the next
/// pod at any moment, so the pod asking may not be its holder.
pub fn unexpired(lock: &NodeLock, now: Timestamp) -> Result<(), AllocateError> {
    let expires = lock.spec.expires_at.0;
    if expires < now {
        return Err(AllocateError::LockExpired {
            lock: lock_name(lock),
            holder: holder(lock),
            expired: expires.to_string(),
            now: now.to_string(),
        });
    }
    Ok(())
}

/// Refuses a lock whose holder, `pod` as read from the API server (`None`:
/// not found), is not the pod of the lock's UID bound to `node`.
pub fn holder_bound_here(
    lock: &NodeLock,
    pod: Option<&Pod>,
    node: &str,
) -> Result<(), AllocateError> {
    let refuse = |reason: String| AllocateError::HolderNotHere {
        lock: lock_name(lock),
        holder: holder(lock),
        reason,
    };
    let Some(pod) = pod else {
        return Err(refuse("the pod does not exist".into()));
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if uid != lock.spec.holder.uid {
        return Err(refuse(format!(
            "the pod of that name has UID {uid} (a new pod of the same name)"
        )));
    }
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    match bound {
        Some(bound) if bound == node => Ok(()),
        Some(other) => Err(refuse(format!(
            "the pod is bound to node {other}, not {node}"
        ))),
        None => Err(refuse(format!(
            "the pod is not bound to any node, not {node}"
        ))),
    }
}

#[cfg(test)]
mod tests;
