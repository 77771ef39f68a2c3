//! Taking and releasing a node's NodeLock.
//!
//! The lock object of a node stays from one pod to the next. Bind takes it
//! by creating it (the node's first GPU pod) or by updating it in place,
//! conditional on the resourceVersion it judged free: its holder was served
//! (the holder's allocation left `Bound`, which is the node agent's release),
//! the lock expired and its holder is not bound to the node, its holder is
//! gone, finished or bound elsewhere, or it is this very pod's (a retry). So two waiters can never both win, and one
//! request takes the lock where a create and a delete did before. While
//! another pod holds it, Bind waits (bounded) for the watches to report the
//! holder served or the lock gone. Binds for the same node queue inside the
//! process, so only the first of them writes: one write per pod instead of
//! one per waiter each time a lock frees.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, PostParams, Preconditions},
};
use tessera_api::v1alpha1::{NodeLock, PodReference, VgpuAllocation};

use super::filter::NOT_READY;
use crate::{
    Error,
    lean_pod::LeanPod,
    projection::{LockTable, Projection},
};

/// How often a waiting Bind confirms the lock with the API server and checks
/// whether its holder pod still needs it. The watch reports a released lock
/// at once; this is the safety net for a holder nobody released (the
/// lifecycle controller releases those too, event-driven). At 500 ms it was
/// 2.6 NodeLock and 2 pod GETs per GPU pod in a burst at 1,000 nodes.
const HOLDER_CHECK: Duration = Duration::from_secs(2);

/// A lock this Bind holds.
#[derive(Debug)]
pub struct HeldLock {
    node: String,
    uid: String,
    /// The lock's resourceVersion as this Bind wrote it: every allocation
    /// written for the node before this Bind took the lock is older.
    pub resource_version: Option<String>,
}

/// A NodeLock naming `holder`, valid for `ttl_seconds` from now.
pub fn lock_object(
    node: &str,
    holder: &PodReference,
    allocation: &str,
    ttl_seconds: u32,
) -> NodeLock {
    NodeLock::held(node, holder, allocation, ttl_seconds, Timestamp::now())
}

/// Takes NodeLocks for Bind: one Bind per node at a time inside this
/// process (first come, first served), each waiting for the node's lock to
/// be released by watching the projection's [`LockTable`] (its locks and
/// their holders' allocations) rather than polling, and writing only when
/// the lock looks free.
#[derive(Clone)]
pub struct Locker {
    client: Client,
    table: Arc<LockTable>,
    turns: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

/// A Bind under way for a node (see [`Locker::pending`]).
#[derive(Debug)]
pub struct Pending {
    /// Held only to be counted by [`Locker::queued`].
    _queue: Arc<tokio::sync::Mutex<()>>,
}

/// This Bind's turn among the Binds for one node in this process.
pub type Turn = tokio::sync::OwnedMutexGuard<()>;

impl Locker {
    /// A locker writing through `client` and watching `projection`'s locks.
    pub fn new(client: Client, projection: &Projection) -> Self {
        Self {
            client,
            table: projection.locks(),
            turns: Arc::default(),
        }
    }

    /// Marks a Bind for `node` under way from its first step (reading the
    /// pod, before it queues for its turn) until the guard is dropped, so
    /// Prioritize sends the next pods elsewhere meanwhile ([`Self::queued`]).
    pub fn pending(&self, node: &str) -> Pending {
        let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        Pending {
            _queue: turns.entry(node.to_owned()).or_default().clone(),
        }
    }

    /// Whether a Bind of this process is under way for `node` ([`Self::pending`]).
    pub fn queued(&self, node: &str) -> bool {
        let turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        // The map holds one reference; each Bind with or awaiting a turn another.
        turns
            .get(node)
            .is_some_and(|queue| Arc::strong_count(queue) > 1)
    }

    /// Waits until `deadline` for this Bind's turn on `node`.
    pub async fn turn(&self, node: &str, deadline: Instant) -> Result<Turn, Error> {
        let started = Instant::now();
        let queue = {
            let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            turns.entry(node.to_owned()).or_default().clone()
        };
        tokio::time::timeout_at(deadline.into(), queue.lock_owned())
            .await
            .map_err(|_| self.busy(node, None, started))
    }

    /// Takes the node's lock for `holder`, waiting until `deadline` while
    /// another pod holds it.
    pub async fn acquire(
        &self,
        node: &str,
        holder: &PodReference,
        allocation: &str,
        ttl_seconds: u32,
        deadline: Instant,
    ) -> Result<HeldLock, Error> {
        let locks: Api<NodeLock> = Api::all(self.client.clone());
        let started = Instant::now();
        let mut changes = self.table.subscribe();
        let mut last_check = Instant::now();
        // The version of a lapsed lock whose holder was checked since.
        let mut checked_expired: Option<String> = None;
        loop {
            changes.borrow_and_update();
            let wanted = lock_object(node, holder, allocation, ttl_seconds);
            let Some((mut current, released)) = self.table.judged(node) else {
                match locks.create(&PostParams::default(), &wanted).await {
                    Ok(created) => return Ok(self.held(created)),
                    Err(kube::Error::Api(status)) if status.is_already_exists() => {
                        self.refresh(&locks, node, None).await?;
                        continue;
                    }
                    Err(e) => return Err(Error::kube(format!("creating NodeLock {node}"))(e)),
                }
            };
            // The node's agent is stopping: no pod may be bound here.
            if current.spec.draining && current.spec.expires_at.0 > Timestamp::now() {
                return Err(Error::NoLongerFits {
                    node: node.to_owned(),
                    reason: format!(
                        "{NOT_READY}it is stopping (its NodeLock is held by {})",
                        current.spec.holder.name
                    ),
                });
            }
            // Released by its holder's allocation (served), or a retry of
            // this very pod: ours to take. A lapsed lock is ours only once
            // its holder is seen not to need it: one bound here and not
            // served yet keeps it (review 2026-12-01, M1), its expiry being
            // another process's clock and its Allocate still to come.
            let mut free = released || current.spec.holder.uid == holder.uid;
            let expired = current.spec.expires_at.0 <= Timestamp::now();
            let expiry_unchecked = expired && checked_expired != current.metadata.resource_version;
            if !free && (expiry_unchecked || last_check.elapsed() >= HOLDER_CHECK) {
                // Now and then, confirm the lock still exists and still serves someone.
                last_check = Instant::now();
                if expired {
                    checked_expired.clone_from(&current.metadata.resource_version);
                }
                let uid = current.metadata.uid.clone();
                match self.refresh(&locks, node, uid.as_deref()).await? {
                    Some(fresh)
                        if fresh.metadata.resource_version == current.metadata.resource_version =>
                    {
                        free = !holder_needs_lock(&self.client, &fresh).await?;
                        current = fresh;
                    }
                    _ => continue,
                }
            }
            if free {
                // In place, conditional on the version judged free: of two
                // Binds that judged the same version, one gets a conflict.
                let mut taken = wanted;
                taken.metadata.resource_version = current.metadata.resource_version.clone();
                match locks.replace(node, &PostParams::default(), &taken).await {
                    Ok(updated) => {
                        if !released {
                            tracing::info!(node, previous = %current.spec.holder.name, "took over NodeLock");
                        }
                        return Ok(self.held(updated));
                    }
                    Err(kube::Error::Api(status)) if status.is_conflict() => {
                        self.refresh(&locks, node, current.metadata.uid.as_deref())
                            .await?;
                    }
                    Err(kube::Error::Api(status)) if status.is_not_found() => {
                        self.table.forget(node, current.metadata.uid.as_deref());
                    }
                    Err(e) => return Err(Error::kube(format!("taking NodeLock {node}"))(e)),
                }
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.busy(node, Some(&current), started));
            }
            // Woken at the expiry for one holder check; past it, at the
            // holder checks' pace.
            let until_expiry = if expired {
                HOLDER_CHECK
            } else {
                Duration::try_from(Timestamp::now().duration_until(current.spec.expires_at.0))
                    .unwrap_or_default()
                    .max(Duration::from_millis(1))
            };
            let nap = (deadline - now)
                .min(HOLDER_CHECK.saturating_sub(last_check.elapsed()))
                .min(until_expiry);
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Releases a lock this Bind took and did not use (its Bind failed):
    /// deletes exactly the version this Bind wrote, so a lock taken since
    /// by another pod stays.
    pub async fn release(&self, lock: &HeldLock) {
        let locks: Api<NodeLock> = Api::all(self.client.clone());
        let params = DeleteParams::default().preconditions(Preconditions {
            uid: Some(lock.uid.clone()),
            resource_version: lock.resource_version.clone(),
        });
        match locks.delete(&lock.node, &params).await {
            Ok(_) => self.table.forget(&lock.node, Some(&lock.uid)),
            Err(error) => {
                tracing::debug!(%error, node = %lock.node, "NodeLock already gone or taken");
            }
        }
    }

    /// Reads the node's lock from the API server into the table; `gone` is
    /// the incarnation to forget when there is none.
    async fn refresh(
        &self,
        locks: &Api<NodeLock>,
        node: &str,
        gone: Option<&str>,
    ) -> Result<Option<NodeLock>, Error> {
        let read = locks
            .get_opt(node)
            .await
            .map_err(Error::kube(format!("reading NodeLock {node}")))?;
        match &read {
            Some(lock) => self.table.record(lock.clone()),
            None => self.table.forget(node, gone),
        }
        Ok(read)
    }

    fn held(&self, lock: NodeLock) -> HeldLock {
        let held = HeldLock {
            node: lock.name_any(),
            uid: lock.metadata.uid.clone().unwrap_or_default(),
            resource_version: lock.metadata.resource_version.clone(),
        };
        self.table.record(lock);
        held
    }

    fn busy(&self, node: &str, current: Option<&NodeLock>, started: Instant) -> Error {
        let holder = current
            .cloned()
            .or_else(|| self.table.get(node))
            .map_or_else(
                || "another Bind for this node".to_owned(),
                |l| format!("{}/{}", l.spec.holder.namespace, l.spec.holder.name),
            );
        Error::LockBusy {
            node: node.to_owned(),
            holder,
            waited_ms: started.elapsed().as_millis(),
        }
    }
}

/// Whether the lock's holder still waits for its devices on the lock's node,
/// decided exactly as the lifecycle controller decides it
/// ([`crate::lifecycle_rules::lock_action`]), from the holder pod and the
/// allocation the lock names, both read now: the holder exists with the same
/// UID, is not finishing, is not bound to another node, and was not served.
pub async fn holder_needs_lock(client: &Client, lock: &NodeLock) -> Result<bool, Error> {
    let holder = &lock.spec.holder;
    let pods: Api<LeanPod> = Api::namespaced(client.clone(), &holder.namespace);
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), &holder.namespace);
    let (pod, allocation) = tokio::try_join!(
        async {
            pods.get_opt(&holder.name)
                .await
                .map_err(Error::kube("reading the NodeLock holder"))
        },
        async {
            allocations
                .get_opt(&lock.spec.allocation)
                .await
                .map_err(Error::kube("reading the NodeLock holder's allocation"))
        },
    )?;
    let action = crate::lifecycle_rules::lock_action(
        lock,
        pod.as_ref(),
        allocation.as_ref(),
        Timestamp::now(),
    );
    Ok(matches!(
        action,
        crate::lifecycle_rules::LockAction::KeepUntil(_)
    ))
}
