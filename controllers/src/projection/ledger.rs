//! The scheduler's view of every GPU node: devices from GpuNodes and the
//! live allocations on them. Pure state, updated event by event.
//!
//! Usage is never stored anywhere else: each node's usage is the fold of the
//! live allocations on it, kept up to date incrementally (add on insert,
//! subtract on removal) and refolded when a node's devices change; so is
//! what each namespace's allocations count against its quotas.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::jiff::Timestamp;

use tessera_api::v1alpha1::{MigPlacement, PlacementScore};

use crate::engine::{
    GpuDevice, MigCut, NodeGpus, Slice,
    quota::{Charge, accumulate},
};

/// How [`super::not_ready`]'s reason starts for a node behind the DRA door.
pub const DRA_DOOR: &str = "FrontDoorDra";

/// Identifies an allocation (named after its pod).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocationKey {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

/// A live allocation: slices on a node's devices, by UUID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveAllocation {
    /// The pod's UID; distinguishes incarnations of a pod name.
    pub pod_uid: String,
    /// The node the pod is bound to.
    pub node: String,
    /// Every slice of every container.
    pub slices: Vec<UuidSlice>,
    /// What the pod counts against its namespace's quotas.
    pub quota: Charge,
    /// The pod's priority, where recorded: only such pods can be preempted.
    pub priority: Option<i32>,
    /// Only held for a preemptor that is not bound yet (see
    /// `VgpuAllocationSpec::nomination`).
    pub nominated: bool,
}

/// A slice of the device with this UUID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UuidSlice {
    /// The device's UUID.
    pub uuid: String,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Percent of SMs.
    pub cores: u32,
    /// Where its MIG instance sits, on a dynamic-MIG device.
    pub mig: Option<MigPlacement>,
    /// The device's cores it holds, by index (AWS NeuronCores).
    pub core_indexes: Vec<u32>,
    /// How many of the device's slices it takes (an Enflame DRS partition's
    /// size; 1 elsewhere).
    pub units: u32,
    /// How it shares its device (MetaX sGPUs: app class and QoS policy).
    pub sharing: Option<tessera_api::v1alpha1::Sharing>,
    /// Taken under the `mutex` policy: the device takes no other slice.
    pub mutex: bool,
}

/// Every GPU node and every live allocation.
#[derive(Debug, Default)]
pub struct Ledger {
    nodes: HashMap<String, NodeGpus>,
    /// Why a node takes no pod now although it has GPUs (its agent says it
    /// is not Ready: not registered with the kubelet, or stopping).
    not_ready: HashMap<String, String>,
    /// Why a node's agent is down although its GpuNode may still say Ready:
    /// its DaemonSet pod is not ready (the kubelet saw its container die),
    /// or it was restarted after the GpuNode last became Ready (derived from
    /// the three maps below by `refresh_agent`).
    agent_down: HashMap<String, String>,
    /// Why the agent's pod is down, as the kubelet reports it.
    agent_pod_down: HashMap<String, String>,
    /// When the serving agent pod's container started (the kubelet's clock).
    agent_started: HashMap<String, Timestamp>,
    /// Since when the GpuNode says Ready=True (the agent's clock, the same
    /// node's): a condition older than the running agent was written by a
    /// dead one.
    ready_since: HashMap<String, Timestamp>,
    allocations: HashMap<AllocationKey, LiveAllocation>,
    by_node: HashMap<String, BTreeSet<AllocationKey>>,
    /// What each namespace's live allocations count against its quotas.
    by_namespace: HashMap<String, Charge>,
    /// How many healthy NVIDIA devices of each memory size (MiB) the nodes
    /// have, kept as nodes change so that the largest is one lookup (the
    /// webhook asks on every pod; scanning 40,000 devices under the read
    /// lock took 15 % of the controller's CPU at 5,000 nodes).
    nvidia_sizes: BTreeMap<u64, usize>,
}

impl Ledger {
    /// A node's devices with their usage.
    pub fn node(&self, name: &str) -> Option<&NodeGpus> {
        self.nodes.get(name)
    }

    /// The live allocations on a node.
    pub fn allocations_on(
        &self,
        node: &str,
    ) -> impl Iterator<Item = (&AllocationKey, &LiveAllocation)> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|key| Some((key, self.allocations.get(key)?)))
    }

    /// A live allocation.
    pub fn allocation(&self, key: &AllocationKey) -> Option<&LiveAllocation> {
        self.allocations.get(key)
    }

    /// What the live allocations of `namespace` count against its quotas.
    pub fn namespace_used(&self, namespace: &str) -> &Charge {
        static NONE: Charge = Charge::new();
        self.by_namespace.get(namespace).unwrap_or(&NONE)
    }

    /// Every namespace whose allocations count against quotas, with what.
    pub fn namespaces_used(&self) -> impl Iterator<Item = (&str, &Charge)> {
        self.by_namespace
            .iter()
            .map(|(ns, used)| (ns.as_str(), used))
    }

    /// Number of GPU nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Number of live allocations.
    pub fn allocation_count(&self) -> usize {
        self.allocations.len()
    }

    /// The largest schedulable memory of any healthy NVIDIA GPU, in MiB
    /// (the webhook refuses NVIDIA requests above it; other vendors'
    /// devices do not count: an Ascend card is no room for an NVIDIA pod).
    pub fn largest_device_mib(&self) -> Option<u64> {
        self.nvidia_sizes.keys().next_back().copied()
    }

    /// Counts a node's healthy NVIDIA devices in or out of `nvidia_sizes`.
    fn count_sizes(&mut self, devices: &[GpuDevice], direction: Direction) {
        for device in devices.iter().filter(|d| d.healthy && d.family.is_nvidia()) {
            let count = self.nvidia_sizes.entry(device.memory_mib).or_default();
            match direction {
                Direction::Add => *count += 1,
                Direction::Remove => *count = count.saturating_sub(1),
            }
            if *count == 0 {
                self.nvidia_sizes.remove(&device.memory_mib);
            }
        }
    }

    /// Sets a node's devices; refolds its usage only when they changed.
    pub fn set_node(&mut self, name: &str, devices: Vec<GpuDevice>) {
        if self.nodes.get(name).is_some_and(|n| n.devices == devices) {
            return;
        }
        let mut node = NodeGpus::new(devices);
        for key in self.by_node.get(name).into_iter().flatten() {
            charge(&mut node, &self.allocations[key], Direction::Add);
        }
        if let Some(old) = self.nodes.remove(name) {
            self.count_sizes(&old.devices, Direction::Remove);
            node.placement_scores = old.placement_scores;
        }
        self.count_sizes(&node.devices, Direction::Add);
        self.nodes.insert(name.to_owned(), node);
    }

    /// Sets what the vendor's plugin says about taking whole devices of a
    /// node (a node without devices keeps nothing).
    pub fn set_placement_scores(&mut self, name: &str, scores: Vec<PlacementScore>) {
        if let Some(node) = self.nodes.get_mut(name) {
            node.placement_scores = scores;
        }
    }

    /// Forgets a node's devices (its allocations stay until their pods go).
    pub fn remove_node(&mut self, name: &str) {
        if let Some(old) = self.nodes.remove(name) {
            self.count_sizes(&old.devices, Direction::Remove);
        }
        self.not_ready.remove(name);
    }

    /// Records why a node's agent pod is down, or that it is up (`None`).
    /// Kept apart from the GpuNode's verdict: either one keeps pods away.
    pub fn set_agent_down(&mut self, name: &str, reason: Option<String>) {
        match reason {
            Some(reason) => self.agent_pod_down.insert(name.to_owned(), reason),
            None => self.agent_pod_down.remove(name),
        };
        self.refresh_agent(name);
    }

    /// Records when the node's serving agent container started.
    pub fn set_agent_started(&mut self, name: &str, started: Option<Timestamp>) {
        match started {
            Some(started) => self.agent_started.insert(name.to_owned(), started),
            None => self.agent_started.remove(name),
        };
        self.refresh_agent(name);
    }

    /// Records since when the node's GpuNode says Ready=True (`None`: it
    /// does not).
    pub fn set_ready_since(&mut self, name: &str, since: Option<Timestamp>) {
        match since {
            Some(since) => self.ready_since.insert(name.to_owned(), since),
            None => self.ready_since.remove(name),
        };
        self.refresh_agent(name);
    }

    /// Forgets every agent pod verdict and start (a relist follows).
    pub fn clear_agents(&mut self) {
        let nodes: Vec<String> = self
            .agent_pod_down
            .keys()
            .chain(self.agent_started.keys())
            .cloned()
            .collect();
        self.agent_pod_down.clear();
        self.agent_started.clear();
        for node in nodes {
            self.refresh_agent(&node);
        }
    }

    fn refresh_agent(&mut self, name: &str) {
        let reason = self.agent_pod_down.get(name).cloned().or_else(|| {
            let started = self.agent_started.get(name)?;
            let since = self.ready_since.get(name)?;
            (since < started).then(|| {
                format!(
                    "node agent restarted at {started} and has not reported since (its GpuNode's Ready dates from {since})"
                )
            })
        });
        match reason {
            Some(reason) => self.agent_down.insert(name.to_owned(), reason),
            None => self.agent_down.remove(name),
        };
    }

    /// Records why a node takes no pod now, or that it does (`None`).
    pub fn set_not_ready(&mut self, name: &str, reason: Option<String>) {
        match reason {
            Some(reason) => self.not_ready.insert(name.to_owned(), reason),
            None => self.not_ready.remove(name),
        };
    }

    /// Why a node takes no pod now, if it does not: its GpuNode's `Ready`
    /// condition is not True, or its agent's pod is down.
    pub fn not_ready(&self, name: &str) -> Option<&str> {
        self.not_ready
            .get(name)
            .or_else(|| self.agent_down.get(name))
            .map(String::as_str)
    }

    /// Every GPU node with whether its agent is ready (its `Ready`
    /// condition is not False), sorted by name. A node behind the DRA door
    /// takes no HAMi-style pod but is ready: it serves its claims.
    pub fn readiness(&self) -> Vec<(&str, bool)> {
        let mut nodes: Vec<(&str, bool)> = self
            .nodes
            .keys()
            .map(|name| {
                let ready = self
                    .not_ready(name)
                    .is_none_or(|reason| reason.starts_with(DRA_DOOR));
                (name.as_str(), ready)
            })
            .collect();
        nodes.sort_unstable();
        nodes
    }

    /// Records a live allocation, replacing an earlier version of it.
    pub fn insert_allocation(&mut self, key: AllocationKey, allocation: LiveAllocation) {
        if self.allocations.get(&key) == Some(&allocation) {
            return;
        }
        self.remove_allocation(&key, None);
        if let Some(node) = self.nodes.get_mut(&allocation.node) {
            charge(node, &allocation, Direction::Add);
        }
        self.by_node
            .entry(allocation.node.clone())
            .or_default()
            .insert(key.clone());
        if !allocation.quota.is_empty() {
            let used = self.by_namespace.entry(key.namespace.clone()).or_default();
            accumulate(used, &allocation.quota, true);
        }
        self.allocations.insert(key, allocation);
    }

    /// Removes an allocation; with `pod_uid`, only that incarnation's.
    /// Returns whether something was removed.
    pub fn remove_allocation(&mut self, key: &AllocationKey, pod_uid: Option<&str>) -> bool {
        if pod_uid.is_some_and(|uid| self.allocations.get(key).is_some_and(|a| a.pod_uid != uid)) {
            return false;
        }
        let Some(allocation) = self.allocations.remove(key) else {
            return false;
        };
        if let Some(node) = self.nodes.get_mut(&allocation.node) {
            charge(node, &allocation, Direction::Remove);
        }
        if let Some(keys) = self.by_node.get_mut(&allocation.node) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_node.remove(&allocation.node);
            }
        }
        if let Some(used) = self.by_namespace.get_mut(&key.namespace) {
            accumulate(used, &allocation.quota, false);
            if used.is_empty() {
                self.by_namespace.remove(&key.namespace);
            }
        }
        true
    }

    /// Replaces every node after a relist.
    pub fn replace_nodes(&mut self, nodes: impl IntoIterator<Item = (String, Vec<GpuDevice>)>) {
        let nodes: HashMap<String, Vec<GpuDevice>> = nodes.into_iter().collect();
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|name| !nodes.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            self.remove_node(&name);
        }
        self.not_ready.retain(|name, _| nodes.contains_key(name));
        for (name, devices) in nodes {
            self.set_node(&name, devices);
        }
    }

    /// Replaces every allocation after a relist.
    pub fn replace_allocations(
        &mut self,
        allocations: impl IntoIterator<Item = (AllocationKey, LiveAllocation)>,
    ) {
        let allocations: HashMap<AllocationKey, LiveAllocation> = allocations.into_iter().collect();
        let gone: Vec<AllocationKey> = self
            .allocations
            .keys()
            .filter(|k| !allocations.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.remove_allocation(&key, None);
        }
        for (key, allocation) in allocations {
            self.insert_allocation(key, allocation);
        }
    }
}

/// Adds an allocation's slices to a node's usage, matching devices by UUID.
pub fn charge_allocation(node: &mut NodeGpus, allocation: &LiveAllocation) {
    charge(node, allocation, Direction::Add);
}

enum Direction {
    Add,
    Remove,
}

/// Takes an allocation's slices off a node's usage (what the node would
/// hold without it).
pub fn release_allocation(node: &mut NodeGpus, allocation: &LiveAllocation) {
    charge(node, allocation, Direction::Remove);
}

/// An allocation's slices as the engine counts them on `node`; slices on
/// devices the node no longer reports hold nothing there and are left out.
pub fn engine_slices(node: &NodeGpus, allocation: &LiveAllocation) -> Vec<Slice> {
    allocation
        .slices
        .iter()
        .filter_map(|slice| {
            Some(Slice {
                device: node.position(&slice.uuid)?,
                memory_mib: slice.memory_mib,
                cores: slice.cores,
                mig: slice.mig.map(|placement| MigCut {
                    profile: None,
                    placement,
                }),
                core_mask: crate::engine::core_mask(&slice.core_indexes),
                units: slice.units,
                profile: None,
                sharing: slice.sharing,
                mutex: slice.mutex,
            })
        })
        .collect()
}

fn charge(node: &mut NodeGpus, allocation: &LiveAllocation, direction: Direction) {
    for slice in engine_slices(node, allocation) {
        match direction {
            Direction::Add => node.charge(&slice),
            Direction::Remove => node.release(&slice),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tessera_api::v1alpha1::OperatingMode;

    use super::*;

    fn device(uuid: &str) -> GpuDevice {
        GpuDevice {
            cordoned: false,
            family: Default::default(),
            network_id: None,
            uuid: uuid.into(),
            index: 0,
            model: "A100".into(),
            memory_mib: 1000,
            cores: 100,
            split_count: 10,
            numa_node: None,
            healthy: true,
            mode: OperatingMode::HamiCore,
            mig: None,
            mig_present: 0,
            profiles: Vec::new(),
            minor: None,
            qos_policy: None,
        }
    }

    fn key(name: &str) -> AllocationKey {
        AllocationKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn only_nvidia_gpus_bound_what_an_nvidia_request_may_ask() {
        let mut ledger = Ledger::default();
        let npu = GpuDevice {
            family: tessera_api::v1alpha1::DeviceFamily::Ascend,
            memory_mib: 65536,
            ..device("NPU-0")
        };
        ledger.set_node("n1", vec![device("GPU-0"), npu]);
        assert_eq!(ledger.largest_device_mib(), Some(1000));
    }

    #[test]
    fn the_largest_gpu_follows_every_node_change() {
        let sized = |uuid: &str, mib: u64, healthy: bool| GpuDevice {
            memory_mib: mib,
            healthy,
            ..device(uuid)
        };
        let mut ledger = Ledger::default();
        assert_eq!(ledger.largest_device_mib(), None);
        ledger.set_node(
            "n1",
            vec![sized("a", 80_000, true), sized("b", 80_000, true)],
        );
        ledger.set_node("n2", vec![sized("c", 40_000, true)]);
        assert_eq!(ledger.largest_device_mib(), Some(80_000));
        // One of two large GPUs turns unhealthy: the other still counts.
        ledger.set_node(
            "n1",
            vec![sized("a", 80_000, false), sized("b", 80_000, true)],
        );
        assert_eq!(ledger.largest_device_mib(), Some(80_000));
        ledger.set_node(
            "n1",
            vec![sized("a", 80_000, false), sized("b", 80_000, false)],
        );
        assert_eq!(ledger.largest_device_mib(), Some(40_000));
        // The same devices again change nothing; a node that goes takes its GPUs.
        ledger.set_node("n2", vec![sized("c", 40_000, true)]);
        assert_eq!(ledger.largest_device_mib(), Some(40_000));
        ledger.set_node("n1", vec![sized("a", 96_000, true)]);
        assert_eq!(ledger.largest_device_mib(), Some(96_000));
        ledger.remove_node("n1");
        assert_eq!(ledger.largest_device_mib(), Some(40_000));
        ledger.remove_node("n2");
        ledger.remove_node("n2");
        assert_eq!(ledger.largest_device_mib(), None);
        // A relist keeps only what it listed.
        ledger.set_node("n3", vec![sized("d", 141_000, true)]);
        ledger.replace_nodes([("n4".to_owned(), vec![sized("e", 24_000, true)])]);
        assert_eq!(ledger.largest_device_mib(), Some(24_000));
        assert!(ledger.node("n3").is_none());
    }

    fn alloc(uid: &str, node: &str, uuid: &str, mib: u64) -> LiveAllocation {
        LiveAllocation {
            quota: Default::default(),
            pod_uid: uid.into(),
            node: node.into(),
            slices: vec![UuidSlice {
                mutex: false,
                uuid: uuid.into(),
                memory_mib: mib,
                cores: 10,
                mig: None,
                core_indexes: Vec::new(),
                units: 1,
                sharing: None,
            }],
            ..LiveAllocation::default()
        }
    }

    #[test]
    fn allocations_before_their_node_are_folded_when_it_arrives() {
        let mut ledger = Ledger::default();
        ledger.insert_allocation(key("a"), alloc("u1", "n1", "GPU-0", 300));
        ledger.set_node("n1", vec![device("GPU-0"), device("GPU-1")]);
        assert_eq!(ledger.node("n1").unwrap().usage[0].memory_mib, 300);
        // The same event twice changes nothing.
        ledger.insert_allocation(key("a"), alloc("u1", "n1", "GPU-0", 300));
        assert_eq!(ledger.node("n1").unwrap().usage[0].memory_mib, 300);
        // A device reorder refolds by UUID.
        ledger.set_node("n1", vec![device("GPU-1"), device("GPU-0")]);
        assert_eq!(ledger.node("n1").unwrap().usage[1].memory_mib, 300);
        assert_eq!(ledger.node("n1").unwrap().usage[0].memory_mib, 0);
    }

    #[test]
    fn namespace_usage_follows_inserts_removals_and_relists() {
        let charged = |mib: u64| Charge::from([("nvidia.com/gpumem".to_owned(), mib)]);
        let with_quota = |uid: &str, mib: u64| LiveAllocation {
            quota: charged(mib),
            ..alloc(uid, "n1", "GPU-0", mib)
        };
        let in_ns = |ns: &str, name: &str| AllocationKey {
            namespace: ns.into(),
            name: name.into(),
        };
        let mut ledger = Ledger::default();
        ledger.insert_allocation(in_ns("a", "p1"), with_quota("u1", 300));
        ledger.insert_allocation(in_ns("a", "p2"), with_quota("u2", 200));
        ledger.insert_allocation(in_ns("b", "p1"), with_quota("u3", 50));
        // The same event again, and a stale delete, change nothing.
        ledger.insert_allocation(in_ns("a", "p1"), with_quota("u1", 300));
        assert!(!ledger.remove_allocation(&in_ns("a", "p2"), Some("old")));
        assert_eq!(ledger.namespace_used("a"), &charged(500));
        assert!(ledger.remove_allocation(&in_ns("a", "p2"), Some("u2")));
        assert_eq!(ledger.namespace_used("a"), &charged(300));
        // A restart relists: the sums are rebuilt exactly.
        ledger.replace_allocations([
            (in_ns("a", "p3"), with_quota("u4", 700)),
            (in_ns("b", "p1"), with_quota("u3", 50)),
        ]);
        assert_eq!(ledger.namespace_used("a"), &charged(700));
        assert_eq!(ledger.namespace_used("b"), &charged(50));
        ledger.remove_allocation(&in_ns("b", "p1"), None);
        assert!(ledger.namespace_used("b").is_empty());
        assert_eq!(ledger.namespaces_used().count(), 1);
    }

    #[test]
    fn a_stale_delete_does_not_remove_a_newer_incarnation() {
        let mut ledger = Ledger::default();
        ledger.set_node("n1", vec![device("GPU-0")]);
        ledger.insert_allocation(key("a"), alloc("new", "n1", "GPU-0", 300));
        assert!(!ledger.remove_allocation(&key("a"), Some("old")));
        assert_eq!(ledger.node("n1").unwrap().usage[0].slices, 1);
        assert!(ledger.remove_allocation(&key("a"), Some("new")));
        assert_eq!(ledger.node("n1").unwrap().usage[0], Default::default());
    }

    #[test]
    fn readiness_lists_every_node_with_its_agents_verdict() {
        let mut ledger = Ledger::default();
        ledger.set_node("n2", vec![device("GPU-2")]);
        ledger.set_node("n1", vec![device("GPU-1")]);
        ledger.set_not_ready("n2", Some("NotRegistered: kubelet restarting".into()));
        // A verdict for a node without a GpuNode lists no node.
        ledger.set_not_ready("ghost", Some("AgentStopping: draining".into()));
        assert_eq!(ledger.readiness(), [("n1", true), ("n2", false)]);
        ledger.set_not_ready("n2", None);
        assert_eq!(ledger.readiness(), [("n1", true), ("n2", true)]);
        // Behind the DRA door: no HAMi-style pod, but the agent is ready.
        ledger.set_not_ready("n1", Some(format!("{}: serves DRA", super::DRA_DOOR)));
        assert_eq!(ledger.readiness(), [("n1", true), ("n2", true)]);
        ledger.remove_node("n1");
        assert_eq!(ledger.readiness(), [("n2", true)]);
    }

    #[test]
    fn a_down_agent_pod_keeps_pods_away_whatever_the_gpunode_says() {
        let mut ledger = Ledger::default();
        ledger.set_node("n1", vec![device("GPU-1")]);
        ledger.set_agent_down("n1", Some("agent pod a-1 is not running".into()));
        assert_eq!(ledger.not_ready("n1"), Some("agent pod a-1 is not running"));
        assert_eq!(ledger.readiness(), [("n1", false)]);
        // The GpuNode's own verdict is named first.
        ledger.set_not_ready("n1", Some("NotRegistered: x".into()));
        assert_eq!(ledger.not_ready("n1"), Some("NotRegistered: x"));
        ledger.set_not_ready("n1", None);
        ledger.set_agent_down("n1", None);
        assert_eq!(ledger.not_ready("n1"), None);
        ledger.set_agent_down("n1", Some("gone".to_owned()));
        assert_eq!(ledger.not_ready("n1"), Some("gone"));
        ledger.clear_agents();
        assert_eq!(ledger.readiness(), [("n1", true)]);
    }

    #[test]
    fn a_ready_condition_older_than_the_running_agent_was_written_by_a_dead_one() {
        let at = |t: &str| -> Timestamp { t.parse().unwrap() };
        let mut ledger = Ledger::default();
        ledger.set_node("n1", vec![device("GPU-1")]);
        ledger.set_ready_since("n1", Some(at("2026-01-01T00:00:00Z")));
        ledger.set_agent_started("n1", Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(
            ledger.not_ready("n1"),
            None,
            "the agent reported Ready after it started"
        );
        // Killed and restarted by the kubelet: the container runs again,
        // the GpuNode still says what the dead agent wrote.
        ledger.set_agent_started("n1", Some(at("2026-01-01T00:05:00Z")));
        assert!(
            ledger
                .not_ready("n1")
                .is_some_and(|r| r.starts_with("node agent restarted at 2026-01-01T00:05:00Z")),
            "{:?}",
            ledger.not_ready("n1")
        );
        // The new agent registers and writes Ready again.
        ledger.set_ready_since("n1", Some(at("2026-01-01T00:05:01Z")));
        assert_eq!(ledger.not_ready("n1"), None);
        // Without a known start (agents not run as watched pods): no opinion.
        ledger.set_agent_started("n1", None);
        ledger.set_ready_since("n1", Some(at("2025-01-01T00:00:00Z")));
        assert_eq!(ledger.not_ready("n1"), None);
    }

    #[test]
    fn relists_replace_everything() {
        let mut ledger = Ledger::default();
        ledger.set_node("n1", vec![device("GPU-0")]);
        ledger.set_node("gone", vec![device("GPU-9")]);
        ledger.insert_allocation(key("a"), alloc("u1", "n1", "GPU-0", 300));
        ledger.insert_allocation(key("b"), alloc("u2", "n1", "GPU-0", 200));
        ledger.replace_nodes([("n1".to_owned(), vec![device("GPU-0")])]);
        ledger.replace_allocations([(key("b"), alloc("u2", "n1", "GPU-0", 200))]);
        assert!(ledger.node("gone").is_none());
        assert_eq!(ledger.node("n1").unwrap().usage[0].memory_mib, 200);
        assert_eq!(ledger.allocation_count(), 1);
    }

    proptest! {
        /// Whatever order node and allocation events arrive in, each node's
        /// usage equals the fold of the live allocations on it.
        #[test]
        fn usage_is_always_the_fold_of_live_allocations(
            events in prop::collection::vec((0u8..4, 0usize..4, 0usize..3, 0usize..3, 1u64..400), 1..80)
        ) {
            let mut ledger = Ledger::default();
            let nodes = ["n0", "n1", "n2"];
            for (kind, name, node, gpu, mib) in events {
                let k = key(&format!("p{name}"));
                match kind {
                    0 => ledger.insert_allocation(k, alloc(&format!("u{mib}"), nodes[node], &format!("GPU-{gpu}"), mib)),
                    1 => { ledger.remove_allocation(&k, None); }
                    2 => ledger.set_node(nodes[node], (0..=gpu).map(|g| device(&format!("GPU-{g}"))).collect()),
                    _ => ledger.remove_node(nodes[node]),
                }
                for name in nodes {
                    let Some(node) = ledger.node(name) else { continue };
                    let mut fold = NodeGpus::new(node.devices.clone());
                    for a in ledger.allocations.values().filter(|a| a.node == name) {
                        charge(&mut fold, a, Direction::Add);
                    }
                    prop_assert_eq!(&fold.usage, &node.usage);
                }
            }
        }
    }
}
