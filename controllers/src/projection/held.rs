//! Which NodeLocks are held: a lock object stays from one pod to the next,
//! and is held only until its holder's allocation is served
//! ([`NodeLock::released_by`](tessera_api::v1alpha1::NodeLock::released_by)),
//! as the watches last showed both (kept together in the [`super::LockTable`]).

use k8s_openapi::jiff::Timestamp;

use super::{LockAges, Projection, lock_ages};

impl Projection {
    /// Whether `node`'s lock is held, as last seen: it exists and its
    /// holder's allocation has not released it.
    pub fn lock_held(&self, node: &str) -> bool {
        self.shared.locks.held(node)
    }

    /// The held NodeLocks as last seen, summed up at `now`.
    pub fn lock_ages(&self, now: Timestamp) -> LockAges {
        lock_ages(self.shared.locks.held_times(), now)
    }
}
