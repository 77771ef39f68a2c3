//! The event-sourced projection: GpuNodes and VgpuAllocations, watched and
//! folded into a [`Ledger`] that Filter reads without touching the API, and
//! the NodeLocks ([`LockTable`]) that a waiting Bind watches instead of polling.
//!
//! A restart rebuilds everything from list+watch; a relist replaces the
//! ledger's contents wholesale. Bind writes its decision into the ledger at
//! once ([`Projection::assume`], undone by [`Projection::forget`]), so the
//! next Filter sees it before the watch event arrives; the event is then a
//! no-op. Nothing else writes the ledger but the watches ([`Feeder`]).
//!
//! When capacity appears on a node GPU pods were turned away from, the
//! projection says so on a channel ([`Projection::take_freed_nodes`]); the
//! extender, which turned them away, tells kube-scheduler
//! (`extender::nudge_nodes`).
//!
//! Beside what placement needs, it keeps what the metrics report: each
//! allocation's phase and creation time, and the node agents' Leases
//! ([`AgentLeases`], watched only when asked for).

pub mod advice;
mod agents;
mod ages;
mod convert;
mod held;
mod leases;
mod ledger;
mod locks;
mod nudge;
mod quotas;
mod seen;
pub mod waiting;

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::{Stream, StreamExt};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Pod, ResourceQuota},
    },
    jiff::Timestamp,
};
use kube::{Client, runtime::watcher};
use tessera_api::v1alpha1::{AllocationPhase, GpuNode, NodeLock, VgpuAllocation};
use tessera_scheduling::request::RequestConfig;
use tokio::sync::{mpsc, watch};

pub use crate::cache::Watches;
use crate::{
    cache::Cache,
    engine::{
        NodeGpus,
        quota::{Charge, Limits},
    },
};

pub use agents::{AgentPods, agent_pod_down};
pub use ages::{LockAges, LockTimes, lock_ages, oldest_age_seconds, seconds_since};
pub use convert::{devices, key, live, not_ready, ready_since};
pub use leases::{AGENT_LEASE_PREFIX, AgentLease, AgentLeases, agent_node};
pub use ledger::DRA_DOOR;
pub use ledger::{
    AllocationKey, Ledger, LiveAllocation, UuidSlice, charge_allocation, engine_slices,
    release_allocation,
};
pub use locks::LockTable;
pub use nudge::Waiters;
pub use quotas::{QuotaTable, limits_keys};
pub use seen::{AllocationSeen, resource_version};

/// What the projection's readers and its [`Feeder`] share: the ledger, the
/// lock and Lease tables, who waits for capacity, the agent pods and the
/// phases seen.
#[derive(Clone, Debug, Default)]
struct Shared {
    ledger: Arc<RwLock<Ledger>>,
    locks: Arc<LockTable>,
    leases: Arc<AgentLeases>,
    waiters: Arc<Waiters>,
    waiting: Arc<waiting::Waiting>,
    /// The pools' tuning advice as the leader last computed it (empty in
    /// other replicas).
    tuning: Arc<std::sync::Mutex<Vec<advice::PoolAdvice>>>,
    nudges: Option<mpsc::UnboundedSender<String>>,
    /// The receiving end of `nudges`, until someone takes it.
    freed_nodes: Arc<std::sync::Mutex<Option<mpsc::UnboundedReceiver<String>>>>,
    agent_pods: Arc<std::sync::Mutex<AgentPods>>,
    quotas: Arc<RwLock<QuotaTable>>,
    /// The highest resourceVersion of a VgpuAllocation the ledger has
    /// applied (0 before any, or when versions are not etcd's integers).
    allocations_version: Arc<watch::Sender<u64>>,
}

/// The shared ledger and whether its first list has completed.
#[derive(Clone, Debug)]
pub struct Projection {
    shared: Shared,
    synced: watch::Receiver<bool>,
}

impl Projection {
    /// A projection kept current by `spawn`'s tasks, or by hand in tests
    /// (which then report no freed node).
    pub fn new() -> (Self, Feeder) {
        Self::with_nudges(None)
    }

    fn with_nudges(
        nudges: Option<(
            mpsc::UnboundedSender<String>,
            mpsc::UnboundedReceiver<String>,
        )>,
    ) -> (Self, Feeder) {
        let (tx, synced) = watch::channel(false);
        let (nudges, freed_nodes) = nudges.unzip();
        let shared = Shared {
            nudges,
            freed_nodes: Arc::new(std::sync::Mutex::new(freed_nodes)),
            ..Shared::default()
        };
        let feeder = Feeder {
            shared: shared.clone(),
            synced: Arc::new(tx),
            nodes_synced: Arc::default(),
            allocations_synced: Arc::default(),
        };
        (Self { shared, synced }, feeder)
    }

    /// Watches GpuNodes, VgpuAllocations and NodeLocks cluster-wide and
    /// keeps the ledger and the lock table current.
    pub fn spawn(client: Client) -> Self {
        Self::spawn_watching(client, &Watches::default())
    }

    /// Like [`Projection::spawn`], and also watches the node agents' Leases
    /// in `lease_namespace` (see [`AgentLeases`]).
    pub fn spawn_with_agent_leases(client: Client, lease_namespace: &str) -> Self {
        Self::spawn_watching(
            client,
            &Watches {
                agent_leases: Some(lease_namespace.to_owned()),
                agent_pods: None,
            },
        )
    }

    /// Like [`Projection::spawn`], with what `watches` adds. Nodes that GPU
    /// pods were turned away from are annotated when capacity appears on
    /// them (see [`Waiters`]).
    pub fn spawn_watching(client: Client, watches: &Watches) -> Self {
        Self::spawn_on(&Cache::spawn(client, watches))
    }

    /// Fed by `cache`'s watches (which it shares with the lifecycle
    /// controllers). Nodes that GPU pods were turned away from are sent on
    /// [`Projection::take_freed_nodes`] when capacity appears on them (see
    /// [`Waiters`]).
    pub fn spawn_on(cache: &Cache) -> Self {
        let (projection, feeder) = Self::with_nudges(Some(mpsc::unbounded_channel()));
        let nodes = cache.gpu_nodes().events();
        tokio::spawn(feeder.clone().feed(nodes, Feeder::node_event));
        let locks = cache.locks().events();
        tokio::spawn(feeder.clone().feed(locks, Feeder::lock_event));
        if let Some(leases) = cache.agent_leases() {
            tokio::spawn(feeder.clone().feed(leases.events(), Feeder::lease_event));
        }
        if let Some(pods) = cache.agent_pods() {
            let events = pods.events();
            tokio::spawn(
                feeder
                    .clone()
                    .feed(events, |f, e, _: &mut ()| f.agent_pod_event(e)),
            );
        }
        let quotas = cache.quotas().events();
        tokio::spawn(feeder.clone().feed(quotas, Feeder::quota_event));
        let allocations = cache.allocations().events();
        tokio::spawn(feeder.feed(allocations, Feeder::allocation_event));
        projection
    }

    /// The nodes on which capacity appeared after GPU pods were turned away
    /// from them, once each per round of rejections, for whoever tells
    /// kube-scheduler (`extender::nudge_nodes`); `None` once taken, or for a
    /// projection fed by hand.
    pub fn take_freed_nodes(&self) -> Option<mpsc::UnboundedReceiver<String>> {
        self.shared
            .freed_nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Capacity appeared on `node` outside the watches (Bind undid its
    /// reservation): if pods were turned away from it, say so.
    fn freed(&self, node: &str) {
        if self.shared.waiters.take(node)
            && let Some(nudges) = &self.shared.nudges
        {
            let _ = nudges.send(node.to_owned());
        }
    }

    /// The nodes GPU pods were turned away from since capacity last appeared
    /// on them. Filter records into it while holding [`Projection::read`].
    pub fn waiters(&self) -> &Waiters {
        &self.shared.waiters
    }

    /// The GPU pods Filter found no node for (see [`waiting`]).
    pub fn waiting(&self) -> &waiting::Waiting {
        &self.shared.waiting
    }

    /// Publishes the pools' tuning advice (for `/metrics`).
    pub fn set_tuning(&self, advice: Vec<advice::PoolAdvice>) {
        *self.shared.tuning.lock().unwrap_or_else(|e| e.into_inner()) = advice;
    }

    /// The pools' tuning advice as last computed here.
    pub fn tuning(&self) -> Vec<advice::PoolAdvice> {
        self.shared
            .tuning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The UIDs of pods with an allocation that places them (not one held
    /// for a preemptor, not released or failed).
    pub fn placed_pods(&self) -> std::collections::HashSet<String> {
        self.shared.locks.with_phases(|phases| {
            phases
                .values()
                .filter(|seen| !seen.held)
                .filter(|seen| {
                    !matches!(
                        seen.phase,
                        Some(AllocationPhase::Released | AllocationPhase::Failed)
                    )
                })
                .map(|seen| seen.pod_uid.clone())
                .collect()
        })
    }

    /// The node agents' Leases as last seen, by node name (empty unless
    /// watched, see [`Projection::spawn_with_agent_leases`]).
    pub fn agent_leases(&self) -> std::collections::BTreeMap<String, AgentLease> {
        self.shared.leases.snapshot()
    }

    /// Where `node`'s serving agent pod answers `/readyz` (only when agent
    /// pods are watched, see [`Watches::agent_pods`]).
    pub fn agent_endpoint(&self, node: &str) -> Option<String> {
        self.shared
            .agent_pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .endpoint(node)
    }

    /// Waits until `deadline` for the ledger to have applied every
    /// VgpuAllocation change up to resourceVersion `version` (the watch
    /// delivers them in that order). False when it has not, or when
    /// `version` is 0 (not an etcd revision).
    pub async fn caught_up(&self, version: u64, deadline: std::time::Instant) -> bool {
        if version == 0 {
            return false;
        }
        let mut seen = self.shared.allocations_version.subscribe();
        tokio::time::timeout_at(deadline.into(), seen.wait_for(|seen| *seen >= version))
            .await
            .is_ok_and(|waited| waited.is_ok())
    }

    /// The NodeLocks as last seen.
    pub fn locks(&self) -> Arc<LockTable> {
        self.shared.locks.clone()
    }

    /// Reads the ledger.
    pub fn read(&self) -> RwLockReadGuard<'_, Ledger> {
        self.shared.ledger.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Ledger> {
        self.shared
            .ledger
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Bind's reservation, made before its writes so the next Filter
    /// already sees it: under the ledger's write lock, drops any earlier
    /// reservation of `key` by pod `uid`, lets `decide` place the pod on
    /// `node` as the ledger holds it now (`None`: no GpuNode) beside what
    /// the pod's namespace holds against its quotas, and reserves the
    /// allocation it returns. No other Bind decides in between, so two pods
    /// never both pass a quota that has room for one.
    pub fn assume<T, E>(
        &self,
        key: &AllocationKey,
        uid: &str,
        node: &str,
        decide: impl FnOnce(Option<&NodeGpus>, &Charge) -> Result<(T, LiveAllocation), E>,
    ) -> Result<T, E> {
        let mut ledger = self.write();
        ledger.remove_allocation(key, Some(uid));
        let (decided, allocation) =
            decide(ledger.node(node), ledger.namespace_used(&key.namespace))?;
        ledger.insert_allocation(key.clone(), allocation);
        Ok(decided)
    }

    /// Preemption's hold: like [`Projection::assume`], but `decide` sees
    /// `node` as it would be without the allocations of `victims` (those
    /// still in the ledger, on that node). The allocation it returns is
    /// recorded beside the victims' until they are released: no other pod
    /// fits into the slices they free.
    pub fn hold<T, E>(
        &self,
        key: &AllocationKey,
        uid: &str,
        node: &str,
        victims: &[AllocationKey],
        decide: impl FnOnce(Option<&NodeGpus>, &Charge) -> Result<(T, LiveAllocation), E>,
    ) -> Result<T, E> {
        let mut ledger = self.write();
        ledger.remove_allocation(key, Some(uid));
        let without = ledger.node(node).map(|gpus| {
            let mut gpus = gpus.clone();
            for victim in victims.iter().filter_map(|v| ledger.allocation(v)) {
                if victim.node == node {
                    release_allocation(&mut gpus, victim);
                }
            }
            gpus
        });
        let (decided, allocation) =
            decide(without.as_ref(), ledger.namespace_used(&key.namespace))?;
        ledger.insert_allocation(key.clone(), allocation);
        Ok(decided)
    }

    /// Puts `allocation` back into the ledger as the API server holds it:
    /// after a failed Bind dropped the pod's hold from the ledger (see
    /// [`Projection::assume`]) while the hold itself stayed, no watch event
    /// would bring it back.
    pub fn restore(&self, allocation: &VgpuAllocation) {
        if let Some(entry) = live(allocation) {
            self.write().insert_allocation(key(allocation), entry);
        }
    }

    /// Undoes [`Projection::assume`] when Bind fails: the reservation goes,
    /// and pods turned away from `node` because of it may fit now.
    pub fn forget(&self, key: &AllocationKey, uid: &str, node: &str) {
        if self.write().remove_allocation(key, Some(uid)) {
            self.freed(node);
        }
    }

    /// The device limits of `namespace`'s ResourceQuotas under `config`
    /// (empty: none).
    pub fn quota_limits(&self, namespace: &str, config: &RequestConfig) -> Limits {
        self.shared
            .quotas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .limits(namespace, config)
    }

    /// Every namespace with a device quota, with its limits under `config`
    /// and what its pods hold.
    pub fn quota_usage(&self, config: &RequestConfig) -> Vec<(String, Limits, Charge)> {
        let quotas = self.shared.quotas.read().unwrap_or_else(|e| e.into_inner());
        let ledger = self.read();
        quotas
            .namespaces()
            .map(|ns| {
                (
                    ns.to_owned(),
                    quotas.limits(ns, config),
                    ledger.namespace_used(ns).clone(),
                )
            })
            .collect()
    }

    /// How many allocations are in each phase (`Pending` before any status).
    pub fn phase_counts(&self) -> std::collections::BTreeMap<String, usize> {
        self.shared.locks.with_phases(|phases| {
            let mut counts = std::collections::BTreeMap::new();
            for seen in phases.values() {
                *counts.entry(seen.phase_name()).or_default() += 1;
            }
            counts
        })
    }

    /// Seconds since the oldest allocation still in phase `Bound` was
    /// created (by Bind, just before the pod was bound); 0 when none is.
    pub fn bound_oldest_seconds(&self, now: Timestamp) -> f64 {
        self.shared.locks.with_phases(|phases| {
            oldest_age_seconds(
                phases
                    .values()
                    .filter(|seen| seen.phase == Some(AllocationPhase::Bound))
                    .filter_map(|seen| seen.created),
                now,
            )
        })
    }

    /// Whether both watches have completed their first list.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until both watches have completed their first list.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }
}

/// One GpuNode of a relist, as the ledger takes it.
#[derive(Debug)]
pub struct NodeEntry {
    name: String,
    devices: Vec<crate::engine::GpuDevice>,
    placement_scores: Vec<tessera_api::v1alpha1::PlacementScore>,
    not_ready: Option<String>,
    ready_since: Option<Timestamp>,
}

/// Applies watch events to the ledger.
#[derive(Clone, Debug)]
pub struct Feeder {
    shared: Shared,
    synced: Arc<watch::Sender<bool>>,
    nodes_synced: Arc<std::sync::atomic::AtomicBool>,
    allocations_synced: Arc<std::sync::atomic::AtomicBool>,
}

impl Feeder {
    /// Writes the ledger: the watches' events, or a caller that fills it by
    /// hand (tests, benchmarks; see [`Feeder::mark_all_synced`]).
    pub fn write(&self) -> RwLockWriteGuard<'_, Ledger> {
        self.shared
            .ledger
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Capacity may have appeared on `node` (the ledger already holds it):
    /// if pods were turned away from it, tell kube-scheduler.
    fn freed(&self, node: &str) {
        if self.shared.waiters.take(node) {
            self.nudge(node.to_owned());
        }
    }

    /// After a relist anything may have changed: every waiting node.
    fn freed_all(&self) {
        for node in self.shared.waiters.take_all() {
            self.nudge(node);
        }
    }

    fn nudge(&self, node: String) {
        if let Some(nudges) = &self.shared.nudges {
            let _ = nudges.send(node);
        }
    }

    /// Declares both initial lists done: for callers that fill the ledger
    /// by hand (benchmarks) instead of through the watches.
    pub fn mark_all_synced(&self) {
        self.mark_synced(&self.nodes_synced);
        self.mark_synced(&self.allocations_synced);
    }

    fn mark_synced(&self, which: &std::sync::atomic::AtomicBool) {
        use std::sync::atomic::Ordering::SeqCst;
        which.store(true, SeqCst);
        if self.nodes_synced.load(SeqCst) && self.allocations_synced.load(SeqCst) {
            self.synced.send_replace(true);
        }
    }

    /// Applies each of `events` with `apply`, which keeps what a relist
    /// gathers in its `relist` until the list is done.
    async fn feed<K, R: Default>(
        self,
        events: impl Stream<Item = watcher::Event<K>>,
        apply: impl Fn(&Self, watcher::Event<K>, &mut R),
    ) {
        let mut relist = R::default();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            apply(&self, event, &mut relist);
        }
    }

    /// Applies one GpuNode event.
    pub fn node_event(&self, event: watcher::Event<GpuNode>, relist: &mut Vec<NodeEntry>) {
        use kube::ResourceExt;
        match event {
            watcher::Event::Apply(node) => {
                let name = node.name_any();
                let mut ledger = self.write();
                ledger.set_node(&name, devices(&node));
                ledger.set_placement_scores(&name, convert::placement_scores(&node));
                ledger.set_not_ready(&name, convert::not_ready(&node));
                ledger.set_ready_since(&name, convert::ready_since(&node));
                let ready = ledger.not_ready(&name).is_none();
                drop(ledger);
                if ready {
                    self.freed(&name);
                }
            }
            watcher::Event::Delete(node) => self.write().remove_node(&node.name_any()),
            watcher::Event::Init => relist.clear(),
            watcher::Event::InitApply(node) => relist.push(NodeEntry {
                name: node.name_any(),
                devices: devices(&node),
                placement_scores: convert::placement_scores(&node),
                not_ready: convert::not_ready(&node),
                ready_since: convert::ready_since(&node),
            }),
            watcher::Event::InitDone => {
                let mut ledger = self.write();
                ledger.replace_nodes(relist.iter().map(|e| (e.name.clone(), e.devices.clone())));
                for entry in relist.drain(..) {
                    ledger.set_placement_scores(&entry.name, entry.placement_scores);
                    ledger.set_not_ready(&entry.name, entry.not_ready);
                    ledger.set_ready_since(&entry.name, entry.ready_since);
                }
                drop(ledger);
                self.mark_synced(&self.nodes_synced);
                self.freed_all();
            }
        }
    }

    /// Applies one ResourceQuota event. A quota whose device limits change
    /// may let pods in that it turned away: every waiting node is nudged.
    /// Status updates (the kube quota controller's and the lifecycle's,
    /// frequent) change no limit and nudge nothing.
    pub fn quota_event(
        &self,
        event: watcher::Event<ResourceQuota>,
        relist: &mut Vec<ResourceQuota>,
    ) {
        let mut quotas = self
            .shared
            .quotas
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let changed = match event {
            watcher::Event::Apply(quota) => quotas.record(&quota),
            watcher::Event::Delete(quota) => quotas.forget(&quota),
            watcher::Event::Init => {
                relist.clear();
                false
            }
            watcher::Event::InitApply(quota) => {
                relist.push(quota);
                false
            }
            watcher::Event::InitDone => {
                quotas.replace(relist.drain(..).as_slice());
                true
            }
        };
        drop(quotas);
        if changed {
            self.freed_all();
        }
    }

    /// Applies one NodeLock event.
    pub fn lock_event(&self, event: watcher::Event<NodeLock>, relist: &mut Vec<NodeLock>) {
        use kube::ResourceExt;
        match event {
            watcher::Event::Apply(lock) => self.shared.locks.record(lock),
            watcher::Event::Delete(lock) => {
                self.shared
                    .locks
                    .forget(&lock.name_any(), lock.metadata.uid.as_deref());
            }
            watcher::Event::Init => relist.clear(),
            watcher::Event::InitApply(lock) => relist.push(lock),
            watcher::Event::InitDone => self.shared.locks.replace(relist.drain(..)),
        }
    }

    /// Applies one Lease event (Leases that are not an agent's are ignored).
    pub fn lease_event(&self, event: watcher::Event<Lease>, relist: &mut Vec<Lease>) {
        use kube::ResourceExt;
        match event {
            watcher::Event::Apply(lease) => self.shared.leases.record(&lease),
            watcher::Event::Delete(lease) => self.shared.leases.forget(&lease),
            watcher::Event::Init => relist.clear(),
            watcher::Event::InitApply(lease) => {
                if agent_node(&lease.name_any()).is_some() {
                    relist.push(lease);
                }
            }
            watcher::Event::InitDone => {
                self.shared.leases.replace(relist.iter());
                relist.clear();
            }
        }
    }

    /// Applies one event of the node agents' pods.
    pub fn agent_pod_event(&self, event: watcher::Event<Pod>) {
        let mut pods = self
            .shared
            .agent_pods
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let node = match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => pods.record(&pod),
            watcher::Event::Delete(pod) => pods.forget(&pod),
            watcher::Event::Init => {
                pods.clear();
                return;
            }
            watcher::Event::InitDone => {
                let all = pods.all();
                drop(pods);
                let mut ledger = self.write();
                ledger.clear_agents();
                for (node, down, started) in all {
                    ledger.set_agent_down(&node, down);
                    ledger.set_agent_started(&node, started);
                }
                drop(ledger);
                self.freed_all();
                return;
            }
        };
        let Some(node) = node else { return };
        let (down, started) = (pods.down(&node), pods.started(&node));
        drop(pods);
        if let Some(reason) = &down {
            tracing::info!(%node, %reason, "node agent down: no GPU pod goes there");
        }
        let mut ledger = self.write();
        ledger.set_agent_down(&node, down);
        ledger.set_agent_started(&node, started);
        let ready = ledger.not_ready(&node).is_none();
        drop(ledger);
        if ready {
            self.freed(&node);
        }
    }

    fn record_phase(&self, event: &watcher::Event<VgpuAllocation>) {
        self.shared.locks.allocation_event(event);
    }

    /// An allocation released or deleted: its entry goes, unless the
    /// ledger's entry for that pod is another incarnation of it. Bind
    /// replaces the hold a preemptor's slices were kept in with the pod's
    /// own allocation (same name, same pod); the hold's deletion must not
    /// take the allocation Bind has just reserved.
    fn gone(&self, allocation: &VgpuAllocation) {
        let held = allocation.spec.nomination.is_some();
        let key = key(allocation);
        let removed = {
            let mut ledger = self.write();
            ledger.allocation(&key).is_some_and(|a| a.nominated == held)
                && ledger.remove_allocation(&key, Some(&allocation.spec.pod_uid))
        };
        if removed {
            self.freed(&allocation.spec.node_name);
        }
    }

    /// Applies one VgpuAllocation event.
    pub fn allocation_event(
        &self,
        event: watcher::Event<VgpuAllocation>,
        relist: &mut AllocationRelist,
    ) {
        let AllocationRelist {
            entries: relist,
            version: relist_version,
        } = relist;
        self.record_phase(&event);
        // The version the ledger holds once this event is applied; a relist
        // counts when it is done.
        let applied = match &event {
            watcher::Event::Init => {
                *relist_version = 0;
                None
            }
            watcher::Event::InitApply(a) => {
                *relist_version = (*relist_version).max(resource_version(a));
                None
            }
            watcher::Event::InitDone => Some(*relist_version),
            watcher::Event::Apply(a) | watcher::Event::Delete(a) => Some(resource_version(a)),
        };
        self.apply_allocation_event(event, relist);
        if let Some(applied) = applied {
            self.shared.allocations_version.send_if_modified(|seen| {
                let newer = applied > *seen;
                if newer {
                    *seen = applied;
                }
                newer
            });
        }
    }

    fn apply_allocation_event(
        &self,
        event: watcher::Event<VgpuAllocation>,
        relist: &mut Vec<(AllocationKey, LiveAllocation)>,
    ) {
        match event {
            watcher::Event::Apply(allocation) => match live(&allocation) {
                Some(entry) => {
                    let mut ledger = self.write();
                    warn_unknown_devices(&ledger, &allocation, &entry);
                    ledger.insert_allocation(key(&allocation), entry);
                }
                None => self.gone(&allocation),
            },
            watcher::Event::Delete(allocation) => self.gone(&allocation),
            watcher::Event::Init => relist.clear(),
            watcher::Event::InitApply(allocation) => {
                if let Some(entry) = live(&allocation) {
                    relist.push((key(&allocation), entry));
                }
            }
            watcher::Event::InitDone => {
                self.write().replace_allocations(relist.drain(..));
                self.mark_synced(&self.allocations_synced);
                self.freed_all();
            }
        }
    }
}

/// What a relist of VgpuAllocations gathers until the list is done.
#[derive(Debug, Default)]
pub struct AllocationRelist {
    entries: Vec<(AllocationKey, LiveAllocation)>,
    version: u64,
}

/// Logs each slice of `entry` on a GPU its node does not report (a hand-made
/// or stale allocation): it holds nothing there (see
/// [`ledger::charge_allocation`]) until the node reports that GPU.
fn warn_unknown_devices(ledger: &Ledger, allocation: &VgpuAllocation, entry: &LiveAllocation) {
    let Some(node) = ledger.node(&entry.node) else {
        return;
    };
    for slice in entry
        .slices
        .iter()
        .filter(|s| node.position(&s.uuid).is_none())
    {
        tracing::warn!(
            namespace = allocation.metadata.namespace.as_deref().unwrap_or_default(),
            allocation = allocation.metadata.name.as_deref().unwrap_or_default(),
            node = %entry.node,
            uuid = %slice.uuid,
            "VgpuAllocation names a GPU its node does not report; it holds nothing until the node reports that GPU"
        );
    }
}
