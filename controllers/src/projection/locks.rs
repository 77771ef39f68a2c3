//! The NodeLocks the projection has seen, so a waiting Bind learns that a
//! node's lock is gone from the watch instead of polling the API server.
//!
//! This view only decides when Bind *tries*: the API server still decides
//! who holds a lock (create is atomic, every update and delete carries the
//! resourceVersion it judged). Whether a lock is held also depends on its
//! holder's allocation (`held.rs`).

use std::{collections::HashMap, sync::Mutex};

use kube::ResourceExt;
use tessera_api::v1alpha1::NodeLock;
use tokio::sync::watch;

/// Every NodeLock by node name, and a signal raised on each change.
#[derive(Debug)]
pub struct LockTable {
    locks: Mutex<HashMap<String, NodeLock>>,
    changed: watch::Sender<u64>,
}

impl Default for LockTable {
    fn default() -> Self {
        Self {
            locks: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl LockTable {
    fn locks(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeLock>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|generation| *generation += 1);
    }

    /// The lock on `node`, as last seen.
    pub fn get(&self, node: &str) -> Option<NodeLock> {
        self.locks().get(node).cloned()
    }

    /// Records a lock that exists (seen by the watch, written or read by
    /// Bind), unless the table has a newer version of the same object: the
    /// watch may deliver a version older than the one Bind just wrote.
    pub fn record(&self, lock: NodeLock) {
        {
            let mut locks = self.locks();
            let newer_known = locks.get(&lock.name_any()).is_some_and(|known| {
                known.metadata.uid == lock.metadata.uid
                    && super::resource_version(known) > super::resource_version(&lock)
            });
            if newer_known {
                return;
            }
            locks.insert(lock.name_any(), lock);
        }
        self.bump();
    }

    /// Forgets the lock on `node` if it is still the incarnation `uid`;
    /// a stale delete never removes a newer lock.
    pub fn forget(&self, node: &str, uid: Option<&str>) {
        let removed = {
            let mut locks = self.locks();
            let current = locks.get(node).and_then(|l| l.metadata.uid.as_deref());
            if uid.is_none() || current.is_none() || current == uid {
                locks.remove(node).is_some()
            } else {
                false
            }
        };
        if removed {
            self.bump();
        }
    }

    /// Replaces every lock after a relist.
    pub fn replace(&self, locks: impl IntoIterator<Item = NodeLock>) {
        *self.locks() = locks.into_iter().map(|l| (l.name_any(), l)).collect();
        self.bump();
    }

    /// Every lock, as last seen.
    pub fn all(&self) -> Vec<NodeLock> {
        self.locks().values().cloned().collect()
    }

    /// A receiver that wakes on the next change of any lock.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tessera_api::v1alpha1::PodReference;

    use super::*;

    fn lock(node: &str, uid: &str) -> NodeLock {
        let mut lock = NodeLock::held(
            node,
            &PodReference {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "pod".into(),
            },
            "p",
            60,
            k8s_openapi::jiff::Timestamp::now(),
        );
        lock.metadata = ObjectMeta {
            name: Some(node.into()),
            uid: Some(uid.into()),
            ..Default::default()
        };
        lock
    }

    #[test]
    fn a_stale_delete_keeps_the_newer_lock() {
        let table = LockTable::default();
        table.record(lock("n1", "new"));
        table.forget("n1", Some("old"));
        assert_eq!(
            table.get("n1").and_then(|l| l.metadata.uid),
            Some("new".into())
        );
        table.forget("n1", Some("new"));
        assert!(table.get("n1").is_none());
    }

    #[test]
    fn an_older_version_of_the_same_lock_never_replaces_a_newer_one() {
        let table = LockTable::default();
        let version = |v: &str| {
            let mut l = lock("n1", "same");
            l.metadata.resource_version = Some(v.into());
            l
        };
        table.record(version("20"));
        table.record(version("10"));
        let kept = |t: &LockTable| t.get("n1").and_then(|l| l.metadata.resource_version);
        assert_eq!(kept(&table), Some("20".into()), "a late watch event");
        table.record(version("30"));
        assert_eq!(kept(&table), Some("30".into()));
        // Another object of the same name (deleted and created again) is newer
        // whatever its version says.
        let mut recreated = lock("n1", "other");
        recreated.metadata.resource_version = Some("5".into());
        table.record(recreated);
        assert_eq!(kept(&table), Some("5".into()));
    }

    #[test]
    fn every_change_wakes_subscribers() {
        let table = LockTable::default();
        let mut rx = table.subscribe();
        table.record(lock("n1", "a"));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        table.forget("n1", Some("other"));
        assert!(!rx.has_changed().unwrap(), "nothing removed, nobody woken");
        table.replace([lock("n2", "b")]);
        assert!(rx.has_changed().unwrap());
        assert!(table.get("n1").is_none() && table.get("n2").is_some());
    }
}
