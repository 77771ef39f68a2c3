//! Prometheus `/metrics` for the node: per GPU (capacity, what the live
//! allocations hold, health, and what NVML measures) and per container (its
//! limits from the allocation, visible before the container's first CUDA
//! call, and the memory its processes hold and when they last launched,
//! read from its shared region once the interposer has created it). HAMi's
//! series are exported under HAMi v2.9's names and labels ([`hami`]) beside
//! Tessera's, so HAMi dashboards keep working.
//!
//! Everything is computed at scrape time from the node's offer, the
//! node-scoped allocation watch, the region files and the backend: nothing
//! is cached between scrapes, and nothing is exported that was not measured.
//!
//! The region files are the tenants' (their directory is mounted writable
//! into their containers), so the agent trusts nothing in them:
//! - it reads and writes them only through [`regions`] (no mapping, no link
//!   followed, no special file opened, exact size, validated header; a
//!   refused region is warned about once per container per 10 minutes and
//!   counted in `tessera_container_region_refused_total`);
//! - limits, priorities and which GPU each ordinal is come from the
//!   container's `VgpuAllocation`, never from its region;
//! - what a region says about usage (memory held, launch times, pids) is
//!   the container's claim: exported as that container's usage, clamped to
//!   its allocation's limit, used for nothing else, and never for another
//!   container or the node's accounting.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use tessera_api::v1alpha1::VgpuAllocation;

use crate::{
    backend::Backend,
    holders::{live_allocations, users_per_gpu},
};

pub mod arbiter;
pub mod cores;
pub mod hami;
pub mod regions;
mod scrape;
mod usage;

pub use scrape::{Scrape, render};
pub use usage::{Reading, Usage};

/// Reads the region of every container directory under `regions`
/// (`<pod-uid>_<container>/region`): keyed by that directory name and ordinal.
/// Regions that do not exist yet or are refused ([`regions::read`]) give no
/// readings.
pub fn read_usage(regions: &Path) -> Usage {
    let mut usage = Usage::new();
    let Ok(entries) = std::fs::read_dir(regions) else {
        return usage;
    };
    for entry in entries.flatten() {
        let Some(dir) = entry.file_name().to_str().map(str::to_owned) else {
            continue; // the agent names them from pod uids and container names
        };
        let Some((_, snapshot)) = self::regions::read(regions, &dir) else {
            continue; // no CUDA call yet, or refused
        };
        for device in &snapshot.devices {
            let bit = u32::try_from(device.index)
                .ok()
                .and_then(|i| 1u32.checked_shl(i))
                .unwrap_or(0);
            let launched_at = snapshot
                .processes
                .iter()
                .filter(|p| p.active_devices & bit != 0)
                .filter_map(|p| p.active_at)
                .max();
            usage.insert(
                (dir.clone(), device.index),
                Reading {
                    used: device.used,
                    launched_at,
                    busy_ns: device.busy_ns,
                },
            );
        }
    }
    usage
}

/// What `/metrics` reports from.
#[derive(Clone)]
pub struct Sources {
    /// The node-scoped watches.
    pub view: crate::view::NodeView,
    /// The node's offer.
    pub offers: tokio::sync::watch::Receiver<crate::offer::Offer>,
    /// The directory of the containers' region directories.
    pub regions: std::path::PathBuf,
    /// The GPU backend, asked for memory in use and utilisation.
    pub backend: Arc<dyn Backend>,
    /// Whether HAMi's legacy names are exported too (`--legacy-metrics`).
    pub legacy: bool,
    /// The device plugin's registration with the kubelet (`/readyz`).
    pub plugin: tokio::sync::watch::Receiver<crate::readiness::PluginState>,
    /// Compute use between scrapes.
    pub core_rates: Arc<cores::CoreRates>,
}

/// Serves `/metrics`, `/healthz` (the process answers) and `/readyz` (the
/// kubelet can hand out this node's GPUs: the device plugin is registered
/// and not stopping) on `listener`. The chart's readiness probe reads
/// `/readyz`, so a restarted agent's pod turns Ready, and the extender sends
/// GPU pods to its node again, only once the kubelet would admit them.
pub async fn serve(listener: tokio::net::TcpListener, sources: Sources) {
    use axum::{Router, http::StatusCode, http::header, routing::get};
    let plugin = sources.plugin.clone();
    let readyz = move || {
        let state = *plugin.borrow();
        async move {
            match state {
                crate::readiness::PluginState::Registered => (StatusCode::OK, "ok"),
                crate::readiness::PluginState::NotRegistered => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the device plugin is not registered with the kubelet",
                ),
                crate::readiness::PluginState::Stopping => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the node agent is stopping",
                ),
            }
        }
    };
    let metrics = move || {
        let sources = sources.clone();
        async move {
            let (devices, core_policy) = {
                let offer = sources.offers.borrow();
                (
                    offer.devices.clone(),
                    offer.resolved.settings.gpu_core_policy,
                )
            };
            let (regions, backend) = (sources.regions.clone(), sources.backend.clone());
            let (usage, host, refused) = tokio::task::spawn_blocking(move || {
                let host = backend.usage().unwrap_or_else(|error| {
                    tracing::warn!(%error, "reading GPU usage for metrics failed");
                    Vec::new()
                });
                let usage = read_usage(&regions);
                (usage, host, self::regions::refusals(&regions))
            })
            .await
            .unwrap_or_default();
            let now_ns = tessera_vgpu_region::priority::monotonic_now();
            let core_use = sources.core_rates.observe(&usage, now_ns);
            let text = render(&Scrape {
                node: sources.view.node(),
                devices: &devices,
                allocations: &sources.view.allocations(),
                usage: &usage,
                core_use: &core_use,
                core_policy,
                refused: &refused,
                host: &host,
                now_ns,
                legacy: sources.legacy,
            });
            (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                text,
            )
        }
    };
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz));
    if let Err(error) = axum::serve(listener, router).await {
        tracing::error!(%error, "metrics server stopped");
    }
}

/// For each live container with a region, per CUDA ordinal: whether its GPU
/// is shared with another live allocation (HAMi's `default` core policy
/// limits compute only then). Keyed by region directory name.
pub fn sharing_marks(allocations: &[VgpuAllocation]) -> BTreeMap<String, Vec<bool>> {
    let users = users_per_gpu(allocations);
    let mut marks = BTreeMap::new();
    for allocation in live_allocations(allocations) {
        for container in &allocation.spec.containers {
            let shared = container
                .devices
                .iter()
                .map(|d| users.get(d.uuid.as_str()).copied().unwrap_or(0) > 1)
                .collect();
            marks.insert(allocation.region_name(&container.name), shared);
        }
    }
    marks
}

/// Writes the sharing marks into the regions that exist and are valid
/// (only where a mark differs from what the region holds).
pub fn write_sharing(root: &Path, marks: BTreeMap<String, Vec<bool>>) {
    use tessera_vgpu_region::Sharing;
    for (dir, shared) in marks {
        let Some((file, snapshot)) = regions::read(root, &dir) else {
            continue; // no CUDA call yet, or refused
        };
        for (ordinal, shared) in shared.into_iter().enumerate() {
            let mark = if shared {
                Sharing::Shared
            } else {
                Sharing::Exclusive
            };
            if snapshot.devices.get(ordinal).map(|d| d.sharing) == Some(mark) {
                continue;
            }
            if let Err(error) = file.set_sharing(ordinal, mark) {
                regions::refused(&root.join(&dir), &error);
                break;
            }
        }
    }
}

/// Writes the sharing marks into the regions that exist, every two seconds.
pub async fn mark_sharing(view: crate::view::NodeView, regions: std::path::PathBuf) {
    let mut ticks = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        ticks.tick().await;
        view.ready().await;
        let marks = sharing_marks(&view.allocations());
        let root = regions.clone();
        let _ = tokio::task::spawn_blocking(move || write_sharing(&root, marks)).await;
    }
}

/// How old a region directory without a live allocation must be before it
/// is removed (a container just served may not be in the watch yet).
const REGION_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// The region directories (`<owner>_<container>`, the owner a pod's UID or a
/// DRA claim's) under `regions` whose owner has no live allocation on the
/// node, older than `REGION_GRACE` (10 minutes).
pub fn stale_regions(
    regions: &Path,
    live_owners: &std::collections::BTreeSet<String>,
) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(regions) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pod = name.split_once('_').map_or(name.as_str(), |(uid, _)| uid);
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= REGION_GRACE);
            old && !live_owners.contains(pod)
        })
        .map(|entry| entry.path())
        .collect()
}

/// Removes the region and limits directories of pods that are gone (the
/// directories under `roots`), every minute.
pub async fn collect_regions(view: crate::view::NodeView, roots: Vec<std::path::PathBuf>) {
    let mut ticks = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        ticks.tick().await;
        view.ready().await;
        let live: std::collections::BTreeSet<String> = view
            .allocations()
            .into_iter()
            .filter(VgpuAllocation::is_live)
            .map(|a| a.region_owner().to_owned())
            .collect();
        let roots = roots.clone();
        let removed = tokio::task::spawn_blocking(move || {
            // remove_dir_all does not follow the links a tenant may have
            // left in its directory (it unlinks them).
            roots
                .iter()
                .flat_map(|root| stale_regions(root, &live))
                .filter(|dir| std::fs::remove_dir_all(dir).is_ok())
                .inspect(|dir| self::regions::forget(dir))
                .count()
        })
        .await
        .unwrap_or(0);
        if removed > 0 {
            tracing::info!(removed, "removed region directories of pods that are gone");
        }
    }
}

#[cfg(test)]
mod tests;
