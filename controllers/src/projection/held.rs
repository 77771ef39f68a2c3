//! Which NodeLocks are held: a lock object stays from one pod to the next,
//! and is held only until its holder's allocation is served
//! ([`NodeLock::released_by`]), as the watches last showed both.

use k8s_openapi::jiff::Timestamp;
use tessera_api::v1alpha1::NodeLock;
use tokio::sync::watch;

use super::{AllocationKey, LockAges, Projection, lock_ages};

impl Projection {
    /// Whether the allocation `lock` names is, as last seen, its holder's
    /// and served: the lock is free for the node's next pod.
    pub fn lock_released(&self, lock: &NodeLock) -> bool {
        let key = AllocationKey {
            namespace: lock.spec.holder.namespace.clone(),
            name: lock.spec.allocation.clone(),
        };
        let phases = self.shared.phases.lock().unwrap_or_else(|e| e.into_inner());
        phases
            .get(&key)
            .is_some_and(|seen| lock.released_by(&seen.pod_uid, seen.phase))
    }

    /// Whether `node`'s lock is held, as last seen: it exists and its
    /// holder's allocation is not served yet.
    pub fn lock_held(&self, node: &str) -> bool {
        self.shared
            .locks
            .get(node)
            .is_some_and(|lock| !self.lock_released(&lock))
    }

    /// The held NodeLocks as last seen, summed up at `now`.
    pub fn lock_ages(&self, now: Timestamp) -> LockAges {
        let held = self
            .shared
            .locks
            .all()
            .into_iter()
            .filter(|lock| !self.lock_released(lock))
            .map(|lock| super::LockTimes {
                acquired_at: lock.spec.acquired_at.0,
                expires_at: lock.spec.expires_at.0,
            });
        lock_ages(held, now)
    }

    /// A receiver that wakes whenever the ledger applies an allocation
    /// change (a holder's `Allocated` write releases its node's lock).
    pub fn allocation_changes(&self) -> watch::Receiver<u64> {
        self.shared.allocations_version.subscribe()
    }
}
