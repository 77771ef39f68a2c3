//! The controller's watches: each kind is listed and watched once per
//! process and fanned out ([`Watched`]) to whoever reads it.
//!
//! ```text
//!                  every replica                       the leader
//! GpuNode        ─> projection ─> extender, webhook, metrics
//! VgpuAllocation ─> projection                        ─> lifecycle: allocations, locks
//! NodeLock       ─> projection (LockTable ─> Bind)    ─> lifecycle: locks
//! agent Leases   ─> projection (metrics)              ─> lifecycle: agent leases
//! agent pods     ─> projection (agent down)
//! ResourceQuota  ─> projection (device quotas)        ─> lifecycle: quota status
//! Pod, Node, GpuNodeConfig (started with each term)   ─> lifecycle
//! ```
//!
//! The watches every replica needs start with the process ([`Cache`]); the
//! ones only the lifecycle controllers read (every Pod, Node and
//! GpuNodeConfig) start and stop with the leader's term, in
//! [`crate::lifecycle`], so a standby replica watches no more than before.

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Pod, ResourceQuota},
};
use kube::{Api, Client, runtime::watcher};
use tessera_api::v1alpha1::{GpuNode, NodeLock, VgpuAllocation};
use tessera_kubekit::{Watch, Watched};

/// Objects per page of the first list of the ledger's kinds, one object
/// per node or per pod (GpuNodes, VgpuAllocations). kube-runtime's default
/// of 500 made a start at 5,000 nodes and 40,000 pods 80 requests per kind,
/// each a round trip the extender waited for.
pub const LIST_PAGE: u32 = 5_000;

/// The watch configuration of a kind with one object per node or per pod.
pub fn large_kind() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE)
}

/// Objects per page of the first list of the Pods and Nodes the lifecycle
/// controllers keep pruned: a page arrives whole before any object of it
/// is pruned (Nodes are decoded as full objects first, `lifecycle/prune.rs`;
/// Pods as [`crate::lean_pod::LeanPod`]), so pages of [`LIST_PAGE`] full
/// pods made the start's memory peak. Nothing waits on these lists to
/// answer kube-scheduler.
pub const PRUNED_LIST_PAGE: u32 = 500;

/// The watch configuration of a large kind kept pruned.
pub fn large_pruned_kind() -> watcher::Config {
    watcher::Config::default().page_size(PRUNED_LIST_PAGE)
}

/// What a replica watches beyond GpuNodes, VgpuAllocations and NodeLocks.
#[derive(Clone, Debug, Default)]
pub struct Watches {
    /// The namespace of the node agents' Leases, for the metrics.
    pub agent_leases: Option<String>,
    /// The node agents' DaemonSet pods: namespace and label selector. A
    /// node whose agent pods are all down takes no GPU pod.
    pub agent_pods: Option<(String, String)>,
}

/// The watches every replica runs, one per kind; clones share them.
#[derive(Clone)]
pub struct Cache {
    client: Client,
    gpu_nodes: Watched<GpuNode>,
    allocations: Watched<VgpuAllocation>,
    locks: Watched<NodeLock>,
    quotas: Watched<ResourceQuota>,
    agent_leases: Option<(String, Watched<Lease>)>,
    agent_pods: Option<Watched<Pod>>,
}

impl Cache {
    /// Starts watching GpuNodes, VgpuAllocations, NodeLocks and ResourceQuotas cluster-wide,
    /// and what `watches` adds, each on a task that runs as long as the
    /// process.
    pub fn spawn(client: Client, watches: &Watches) -> Self {
        let everything = watcher::Config::default;
        let agent_leases = watches.agent_leases.as_ref().map(|namespace| {
            let api = Api::<Lease>::namespaced(client.clone(), namespace);
            (namespace.clone(), Watch::new(api, everything()).spawn())
        });
        let agent_pods = watches.agent_pods.as_ref().map(|(namespace, selector)| {
            let api = Api::<Pod>::namespaced(client.clone(), namespace);
            Watch::new(api, everything().labels(selector)).spawn()
        });
        Self {
            gpu_nodes: Watch::new(Api::all(client.clone()), large_kind()).spawn(),
            allocations: Watch::new(Api::all(client.clone()), large_kind()).spawn(),
            locks: Watch::new(Api::all(client.clone()), everything()).spawn(),
            quotas: Watch::new(Api::all(client.clone()), everything()).spawn(),
            agent_leases,
            agent_pods,
            client,
        }
    }

    /// The client the watches use.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Every GpuNode.
    pub fn gpu_nodes(&self) -> &Watched<GpuNode> {
        &self.gpu_nodes
    }

    /// Every VgpuAllocation.
    pub fn allocations(&self) -> &Watched<VgpuAllocation> {
        &self.allocations
    }

    /// Every NodeLock.
    pub fn locks(&self) -> &Watched<NodeLock> {
        &self.locks
    }

    /// Every ResourceQuota.
    pub fn quotas(&self) -> &Watched<ResourceQuota> {
        &self.quotas
    }

    /// The Leases of the agents' namespace ([`Watches::agent_leases`]).
    pub fn agent_leases(&self) -> Option<&Watched<Lease>> {
        self.agent_leases.as_ref().map(|(_, leases)| leases)
    }

    /// The Leases of `namespace`, when that is the namespace watched.
    pub fn agent_leases_in(&self, namespace: &str) -> Option<&Watched<Lease>> {
        self.agent_leases
            .as_ref()
            .filter(|(watched, _)| watched == namespace)
            .map(|(_, leases)| leases)
    }

    /// The node agents' pods ([`Watches::agent_pods`]).
    pub fn agent_pods(&self) -> Option<&Watched<Pod>> {
        self.agent_pods.as_ref()
    }
}
