//! Lifecycle controllers, event-driven (kube-runtime):
//!
//! - allocations: a VgpuAllocation becomes `Released` as soon as its pod is
//!   deleted or finishes (the owner reference then deletes it with the pod);
//! - locks: a NodeLock is deleted as soon as its holder is deleted, finished,
//!   bound elsewhere, or served, and at its expiry otherwise;
//! - configs: each GpuNodeConfig's status lists the nodes it selects and its
//!   conflicts with configs of equal priority;
//! - agent leases: a GpuNode whose agent stopped renewing its Lease
//!   (`tessera-agent-<node>`) gets `Ready=Unknown` (`AgentLeaseExpired`) at
//!   the moment the Lease lapses, as the node lifecycle controller does for
//!   kubelets; the agent's next write replaces it.

mod allocations;
mod caches;
mod configs;
mod leases;
mod locks;
mod prune;
mod quotas;

use std::sync::Arc;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{Api, runtime::watcher};
use tessera_api::v1alpha1::GpuNodeConfig;
use tessera_kubekit::Watch;

pub use crate::lifecycle_rules::{
    AGENT_LEASE_EXPIRED, DEFAULT_LEASE_SECONDS, LeaseVerdict, LockAction, admitted,
    lease_lapsed_conditions, lease_verdict, lock_action, release_reason, served_unrecorded,
};

use crate::{cache::Cache, lean_pod::LeanPod};
use caches::Caches;

/// Runs the controllers on `cache` until the process stops, with the
/// agents' Leases in `kube-node-lease` and the vendor sources of `request`.
pub async fn run(cache: Cache, request: &tessera_scheduling::request::RequestConfig) {
    run_with(
        cache,
        Some("kube-node-lease".to_owned()),
        request.clone(),
        None,
    )
    .await;
}

/// Runs the controllers on `cache` until the process stops (or the future
/// is dropped: leadership lost); the agents' Leases are watched in
/// `agent_lease_namespace` (`None`: not watched). With `tuning`, the
/// tuning advice runs too ([`crate::tuning`]), reading the projection's
/// agent endpoints and waiting pods.
///
/// VgpuAllocations and NodeLocks come from `cache`'s watches, and so do
/// the Leases when `cache` watches that namespace. Every Pod, Node and
/// GpuNodeConfig is watched here, once each for all the controllers, and
/// only while this future runs.
pub async fn run_with(
    cache: Cache,
    agent_lease_namespace: Option<String>,
    request: tessera_scheduling::request::RequestConfig,
    tuning: Option<(crate::projection::Projection, crate::tuning::Settings)>,
) {
    let vendors = crate::vendors::Sources::of(&request);
    let client = cache.client().clone();
    let everything = watcher::Config::default;
    // Every Pod and Node of the cluster, kept as the few fields read here.
    let pods = Watch::new(
        Api::<LeanPod>::all(client.clone()),
        crate::cache::large_pruned_kind(),
    );
    let (pods, watch_pods) = pods.prune(crate::lean_pod::prune).start();
    let nodes = Watch::new(
        Api::<Node>::all(client.clone()),
        crate::cache::large_pruned_kind(),
    );
    let (nodes, watch_nodes) = nodes.prune(prune::node).start();
    let (configs, watch_configs) =
        Watch::new(Api::<GpuNodeConfig>::all(client.clone()), everything()).start();
    let (leases, watch_leases) = match agent_lease_namespace {
        None => (None, None),
        Some(namespace) => match cache.agent_leases_in(&namespace) {
            Some(shared) => (Some(shared.clone()), None),
            None => {
                let api = Api::<Lease>::namespaced(client.clone(), &namespace);
                let (leases, watch) = Watch::new(api, everything()).start();
                (Some(leases), Some(watch))
            }
        },
    };
    let caches = Arc::new(Caches {
        client: client.clone(),
        pods: pods.store(),
        allocations: cache.allocations().clone(),
        released_locks: caches::Released::default(),
    });
    tokio::join!(
        watch_pods,
        watch_nodes,
        watch_configs,
        async {
            if let Some(watch) = watch_leases {
                watch.await;
            }
        },
        async {
            caches.wait_listed(&cache).await;
            tokio::join!(
                allocations::run(caches.clone(), &pods),
                locks::run(caches.clone(), cache.locks(), &pods),
            );
        },
        configs::run(client.clone(), &configs, &nodes),
        crate::vendors::nodes::run(client.clone(), &nodes, vendors),
        quotas::run(
            client.clone(),
            cache.quotas().clone(),
            cache.allocations().clone(),
            request,
        ),
        async {
            if let Some(leases) = leases {
                leases::run(client.clone(), leases).await;
            }
        },
        async {
            if let Some((projection, settings)) = tuning {
                crate::tuning::run(
                    client.clone(),
                    projection,
                    cache.gpu_nodes().store(),
                    configs.store(),
                    settings,
                )
                .await;
            }
        },
    );
}
