//! The NodeLocks the projection has seen, so a waiting Bind learns that a
//! node's lock is gone from the watch instead of polling the API server.
//!
//! This view only decides when Bind *tries*: the API server still decides
//! who holds a lock (create is atomic, every update and delete carries the
//! resourceVersion it judged). Whether a lock is held also depends on its
//! holder's allocation ([`NodeLock::released_by`]), so the table also keeps
//! the phase of every allocation seen.

use std::{collections::HashMap, sync::Mutex};

use kube::ResourceExt;
use kube::runtime::watcher;
use tessera_api::v1alpha1::{NodeLock, VgpuAllocation};
use tokio::sync::watch;

use super::{
    ages::LockTimes,
    convert::key,
    ledger::AllocationKey,
    seen::{AllocationSeen, resource_version},
};

/// Every NodeLock by node name with whether its holder's allocation has
/// released it, the phase of every allocation seen (which decides that),
/// and a signal raised whenever a lock changes or is released.
///
/// Whether a lock is released is kept with the lock and updated by both
/// event streams, so asking costs one lookup (Prioritize asks for every
/// candidate node). Both maps are only ever locked in one order: `locks`,
/// then `phases`.
#[derive(Debug)]
pub struct LockTable {
    locks: Mutex<Locks>,
    phases: Mutex<HashMap<AllocationKey, AllocationSeen>>,
    changed: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Locks {
    by_node: HashMap<String, Entry>,
    /// The allocation each lock names, to its node.
    by_holder: HashMap<AllocationKey, String>,
}

#[derive(Debug)]
struct Entry {
    lock: NodeLock,
    /// The holder's allocation, as last seen, released the lock.
    released: bool,
}

impl Default for LockTable {
    fn default() -> Self {
        Self {
            locks: Mutex::default(),
            phases: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

/// The allocation `lock` names.
fn holder_key(lock: &NodeLock) -> AllocationKey {
    AllocationKey {
        namespace: lock.spec.holder.namespace.clone(),
        name: lock.spec.allocation.clone(),
    }
}

/// Whether the allocation `lock` names, in `phases`, releases it.
fn released(phases: &HashMap<AllocationKey, AllocationSeen>, lock: &NodeLock) -> bool {
    phases
        .get(&holder_key(lock))
        .is_some_and(|seen| lock.released_by(&seen.pod_uid, seen.phase))
}

impl Locks {
    fn insert(&mut self, lock: NodeLock, released: bool) {
        let node = lock.name_any();
        self.remove(&node);
        self.by_holder.insert(holder_key(&lock), node.clone());
        self.by_node.insert(node, Entry { lock, released });
    }

    fn remove(&mut self, node: &str) -> bool {
        let Some(old) = self.by_node.remove(node) else {
            return false;
        };
        let key = holder_key(&old.lock);
        if self.by_holder.get(&key).is_some_and(|n| n == node) {
            self.by_holder.remove(&key);
        }
        true
    }
}

impl LockTable {
    fn locks(&self) -> std::sync::MutexGuard<'_, Locks> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn phases(&self) -> std::sync::MutexGuard<'_, HashMap<AllocationKey, AllocationSeen>> {
        self.phases.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|generation| *generation += 1);
    }

    /// The lock on `node`, as last seen.
    pub fn get(&self, node: &str) -> Option<NodeLock> {
        self.locks().by_node.get(node).map(|e| e.lock.clone())
    }

    /// The lock on `node` and whether its holder's allocation released it,
    /// as last seen.
    pub fn judged(&self, node: &str) -> Option<(NodeLock, bool)> {
        self.locks()
            .by_node
            .get(node)
            .map(|e| (e.lock.clone(), e.released))
    }

    /// Whether `node`'s lock is held, as last seen: it exists and its
    /// holder's allocation has not released it.
    pub fn held(&self, node: &str) -> bool {
        self.locks().by_node.get(node).is_some_and(|e| !e.released)
    }

    /// Records a lock that exists (seen by the watch, written or read by
    /// Bind), unless the table has a newer version of the same object: the
    /// watch may deliver a version older than the one Bind just wrote.
    pub fn record(&self, lock: NodeLock) {
        {
            let mut locks = self.locks();
            let newer_known = locks.by_node.get(&lock.name_any()).is_some_and(|known| {
                known.lock.metadata.uid == lock.metadata.uid
                    && resource_version(&known.lock) > resource_version(&lock)
            });
            if newer_known {
                return;
            }
            let released = released(&self.phases(), &lock);
            locks.insert(lock, released);
        }
        self.bump();
    }

    /// Forgets the lock on `node` if it is still the incarnation `uid`;
    /// a stale delete never removes a newer lock.
    pub fn forget(&self, node: &str, uid: Option<&str>) {
        let removed = {
            let mut locks = self.locks();
            let current = locks
                .by_node
                .get(node)
                .and_then(|e| e.lock.metadata.uid.clone());
            if uid.is_none() || current.is_none() || current.as_deref() == uid {
                locks.remove(node)
            } else {
                false
            }
        };
        if removed {
            self.bump();
        }
    }

    /// Replaces every lock after a relist.
    pub fn replace(&self, relisted: impl IntoIterator<Item = NodeLock>) {
        {
            let mut locks = self.locks();
            let phases = self.phases();
            *locks = Locks::default();
            for lock in relisted {
                let released = released(&phases, &lock);
                locks.insert(lock, released);
            }
        }
        self.bump();
    }

    /// When each held lock was taken and when it lapses, for metrics.
    pub fn held_times(&self) -> Vec<LockTimes> {
        self.locks()
            .by_node
            .values()
            .filter(|e| !e.released)
            .map(|e| LockTimes {
                acquired_at: e.lock.spec.acquired_at.0,
                expires_at: e.lock.spec.expires_at.0,
            })
            .collect()
    }

    /// Applies one allocation event to the phases, and to the lock naming
    /// that allocation, if any (waking waiters when it is released).
    pub fn allocation_event(&self, event: &watcher::Event<VgpuAllocation>) {
        let changed = {
            let mut locks = self.locks();
            let mut phases = self.phases();
            let touched = match event {
                watcher::Event::Apply(a) | watcher::Event::InitApply(a) => {
                    phases.insert(key(a), AllocationSeen::of(a));
                    Some(key(a))
                }
                watcher::Event::Delete(a) => {
                    phases.remove(&key(a));
                    Some(key(a))
                }
                watcher::Event::Init => {
                    phases.clear();
                    None
                }
                watcher::Event::InitDone => None,
            };
            let nodes: Vec<String> = match &touched {
                Some(key) => locks.by_holder.get(key).cloned().into_iter().collect(),
                None => locks.by_node.keys().cloned().collect(),
            };
            let mut changed = false;
            for node in nodes {
                if let Some(entry) = locks.by_node.get_mut(&node) {
                    let now = released(&phases, &entry.lock);
                    changed |= now != entry.released;
                    entry.released = now;
                }
            }
            changed
        };
        if changed {
            self.bump();
        }
    }

    /// Reads the phases of every allocation seen.
    pub fn with_phases<T>(
        &self,
        read: impl FnOnce(&HashMap<AllocationKey, AllocationSeen>) -> T,
    ) -> T {
        read(&self.phases())
    }

    /// A receiver that wakes on the next change of any lock, and when a
    /// holder's allocation releases one.
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
    fn the_holders_allocation_releases_the_lock_whichever_comes_first() {
        use tessera_api::testing;
        let allocation = |uid: &str, phase: &str| {
            testing::allocation("p", uid, "n1")
                .namespace("ns")
                .phase(serde_json::from_value(serde_json::json!(phase)).unwrap())
                .build()
        };
        let table = LockTable::default();
        let mut rx = table.subscribe();
        table.record(lock("n1", "a"));
        assert!(table.held("n1"));
        rx.mark_unchanged();
        table.allocation_event(&watcher::Event::Apply(allocation("pod", "Bound")));
        assert!(table.held("n1"));
        assert!(!rx.has_changed().unwrap(), "nothing released, nobody woken");
        table.allocation_event(&watcher::Event::Apply(allocation("pod", "Allocated")));
        assert!(!table.held("n1"), "served: released");
        assert!(rx.has_changed().unwrap(), "a waiting Bind wakes");
        assert_eq!(table.judged("n1").map(|(_, released)| released), Some(true));
        // Another pod of the same name is not the holder.
        table.allocation_event(&watcher::Event::Apply(allocation("other", "Allocated")));
        assert!(table.held("n1"));
        // The allocation seen before the lock: released from the start.
        table.allocation_event(&watcher::Event::Apply(allocation("pod", "Released")));
        table.forget("n1", None);
        table.record(lock("n1", "b"));
        assert!(!table.held("n1"));
        // A relist of the allocations starts from nothing.
        table.allocation_event(&watcher::Event::Init);
        assert!(table.held("n1"));
        table.allocation_event(&watcher::Event::InitApply(allocation("pod", "Allocated")));
        table.allocation_event(&watcher::Event::InitDone);
        assert!(!table.held("n1"));
        assert!(table.held_times().is_empty());
        assert!(!table.held("n2"), "no lock, not held");
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
