//! Prometheus `/metrics` for the node: per GPU (capacity, what the live
//! allocations hold, health) and per container (its limits from the
//! allocation, visible before the container's first CUDA call, and the
//! memory its processes hold, read from its shared region once the
//! interposer has created it). Per-container series carry HAMi's names and
//! labels beside Tessera's, so HAMi dashboards keep working.
//!
//! Everything is computed at scrape time from the node's offer, the
//! node-scoped allocation watch and the region files: nothing is cached
//! between scrapes, and nothing is exported that was not measured.

use std::{collections::BTreeMap, path::Path};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};
use tessera_api::v1alpha1::{AllocationPhase, DeviceHealth, GpuDevice, VgpuAllocation};

use crate::plugin::REGION_FILE;

/// Labels of a per-GPU series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    uuid: String,
    index: String,
    model: String,
}

/// Labels of a per-container Tessera series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerLabels {
    namespace: String,
    pod: String,
    container: String,
    uuid: String,
    device_index: String,
}

/// Labels of a per-container HAMi series (HAMi's vGPU monitor names them so).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HamiLabels {
    podnamespace: String,
    podname: String,
    ctrname: String,
    vdeviceid: String,
    deviceuuid: String,
}

const MIB: i64 = 1 << 20;

/// Memory in use per container and CUDA ordinal, read from region files.
pub type Usage = BTreeMap<(String, usize), u64>;

/// Reads the region of every container directory under `regions`
/// (`<pod-uid>_<container>/region`): keyed by that directory name and ordinal.
pub fn read_usage(regions: &Path) -> Usage {
    let mut usage = Usage::new();
    let Ok(entries) = std::fs::read_dir(regions) else {
        return usage;
    };
    for entry in entries.flatten() {
        let dir = entry.file_name().to_string_lossy().into_owned();
        let Ok(region) = tessera_vgpu_region::Region::open(&entry.path().join(REGION_FILE)) else {
            continue; // no CUDA call yet, or not a region
        };
        for device in region.snapshot().devices {
            usage.insert((dir.clone(), device.index), device.used);
        }
    }
    usage
}

/// The metrics text for the node's devices and live allocations.
pub fn render(
    node: &str,
    devices: &[GpuDevice],
    allocations: &[VgpuAllocation],
    usage: &Usage,
) -> String {
    let mut registry = Registry::default();
    let gpu = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<GpuLabels, Gauge>::default();
        registry.register(name, help, family.clone());
        family
    };
    let memory_total = gpu(
        &mut registry,
        "tessera_gpu_memory_total_bytes",
        "Device memory the scheduler may hand out (after scaling)",
    );
    let memory_allocated = gpu(
        &mut registry,
        "tessera_gpu_memory_allocated_bytes",
        "Device memory held by live allocations",
    );
    let cores_allocated = gpu(
        &mut registry,
        "tessera_gpu_cores_allocated_percent",
        "Percent of SMs held by live allocations",
    );
    let slices_allocated = gpu(
        &mut registry,
        "tessera_gpu_slices_allocated",
        "vGPU slices held by live allocations",
    );
    let healthy = gpu(
        &mut registry,
        "tessera_gpu_healthy",
        "1 when the GPU can take work, 0 when not",
    );

    let container = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<ContainerLabels, Gauge>::default();
        registry.register(name, help, family.clone());
        family
    };
    let limit = container(
        &mut registry,
        "tessera_container_memory_limit_bytes",
        "A container's device memory limit",
    );
    let core_limit = container(
        &mut registry,
        "tessera_container_core_limit_percent",
        "A container's compute limit, percent of SMs",
    );
    let used = container(
        &mut registry,
        "tessera_container_memory_used_bytes",
        "Device memory a container's processes hold (from its shared region)",
    );
    let hami = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<HamiLabels, Gauge>::default();
        registry.register(name, help, family.clone());
        family
    };
    let hami_limit = hami(
        &mut registry,
        "hami_vgpu_memory_limit_bytes",
        "HAMi-compatible: a container's device memory limit",
    );
    let hami_core_limit = hami(
        &mut registry,
        "hami_vgpu_core_limit_percent",
        "HAMi-compatible: a container's compute limit",
    );
    let hami_used = hami(
        &mut registry,
        "hami_vgpu_memory_used_bytes",
        "HAMi-compatible: device memory a container's processes hold",
    );

    let labels: BTreeMap<&str, GpuLabels> = devices
        .iter()
        .map(|d| {
            (
                d.uuid.as_str(),
                GpuLabels {
                    node: node.to_owned(),
                    uuid: d.uuid.clone(),
                    index: d.index.to_string(),
                    model: d.model.clone(),
                },
            )
        })
        .collect();
    for device in devices {
        let l = &labels[device.uuid.as_str()];
        memory_total
            .get_or_create(l)
            .set(gauge(device.capacity.memory_mib) * MIB);
        healthy
            .get_or_create(l)
            .set(i64::from(device.health == DeviceHealth::Healthy));
        memory_allocated.get_or_create(l).set(0);
        cores_allocated.get_or_create(l).set(0);
        slices_allocated.get_or_create(l).set(0);
    }
    for allocation in allocations {
        let phase = allocation.status.as_ref().and_then(|s| s.phase);
        if matches!(
            phase,
            Some(AllocationPhase::Released | AllocationPhase::Failed)
        ) {
            continue;
        }
        let namespace = allocation.metadata.namespace.clone().unwrap_or_default();
        for c in &allocation.spec.containers {
            let dir = format!("{}_{}", allocation.spec.pod_uid, c.name);
            for (i, slice) in c.devices.iter().enumerate() {
                if let Some(l) = labels.get(slice.uuid.as_str()) {
                    memory_allocated
                        .get_or_create(l)
                        .inc_by(gauge(slice.memory_mib) * MIB);
                    cores_allocated
                        .get_or_create(l)
                        .inc_by(i64::from(slice.cores));
                    slices_allocated.get_or_create(l).inc();
                }
                let ours = ContainerLabels {
                    namespace: namespace.clone(),
                    pod: allocation.spec.pod_name.clone(),
                    container: c.name.clone(),
                    uuid: slice.uuid.clone(),
                    device_index: i.to_string(),
                };
                let theirs = HamiLabels {
                    podnamespace: namespace.clone(),
                    podname: allocation.spec.pod_name.clone(),
                    ctrname: c.name.clone(),
                    vdeviceid: i.to_string(),
                    deviceuuid: slice.uuid.clone(),
                };
                let bytes = gauge(slice.memory_mib) * MIB;
                limit.get_or_create(&ours).set(bytes);
                hami_limit.get_or_create(&theirs).set(bytes);
                core_limit.get_or_create(&ours).set(i64::from(slice.cores));
                hami_core_limit
                    .get_or_create(&theirs)
                    .set(i64::from(slice.cores));
                if let Some(in_use) = usage.get(&(dir.clone(), i)) {
                    used.get_or_create(&ours).set(gauge(*in_use));
                    hami_used.get_or_create(&theirs).set(gauge(*in_use));
                }
            }
        }
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

/// Serves `/metrics` and `/healthz` on `listener`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    view: crate::view::NodeView,
    offers: tokio::sync::watch::Receiver<crate::inventory::Offer>,
    regions: std::path::PathBuf,
) {
    use axum::{Router, http::header, routing::get};
    let metrics = move || {
        let (view, offers, regions) = (view.clone(), offers.clone(), regions.clone());
        async move {
            let devices = offers.borrow().devices.clone();
            let usage = tokio::task::spawn_blocking(move || read_usage(&regions))
                .await
                .unwrap_or_default();
            let text = render(view.node(), &devices, &view.allocations(), &usage);
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
        .route("/healthz", get(|| async { "ok" }));
    if let Err(error) = axum::serve(listener, router).await {
        tracing::error!(%error, "metrics server stopped");
    }
}

/// The allocations that still hold their slices (not Released or Failed).
pub fn live_allocations(allocations: &[VgpuAllocation]) -> impl Iterator<Item = &VgpuAllocation> {
    allocations.iter().filter(|a| {
        !matches!(
            a.status.as_ref().and_then(|s| s.phase),
            Some(AllocationPhase::Released | AllocationPhase::Failed)
        )
    })
}

/// For each live container with a region, per CUDA ordinal: whether its GPU
/// is shared with another live allocation (HAMi's `default` core policy
/// limits compute only then). Keyed by region directory name.
pub fn sharing_marks(allocations: &[VgpuAllocation]) -> BTreeMap<String, Vec<bool>> {
    let live: Vec<&VgpuAllocation> = live_allocations(allocations).collect();
    let mut users: BTreeMap<&str, usize> = BTreeMap::new();
    for allocation in &live {
        for container in &allocation.spec.containers {
            for slice in &container.devices {
                *users.entry(slice.uuid.as_str()).or_default() += 1;
            }
        }
    }
    let mut marks = BTreeMap::new();
    for allocation in &live {
        for container in &allocation.spec.containers {
            let shared = container
                .devices
                .iter()
                .map(|d| users.get(d.uuid.as_str()).copied().unwrap_or(0) > 1)
                .collect();
            marks.insert(
                format!("{}_{}", allocation.spec.pod_uid, container.name),
                shared,
            );
        }
    }
    marks
}

/// Writes the sharing marks into the regions that exist, every two seconds.
pub async fn mark_sharing(view: crate::view::NodeView, regions: std::path::PathBuf) {
    use tessera_vgpu_region::{Region, Sharing};
    let mut ticks = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        ticks.tick().await;
        view.ready().await;
        let marks = sharing_marks(&view.allocations());
        let root = regions.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for (dir, shared) in marks {
                let Ok(region) = Region::open(&root.join(dir).join(REGION_FILE)) else {
                    continue; // no CUDA call yet
                };
                for (ordinal, shared) in shared.into_iter().enumerate() {
                    let mark = if shared {
                        Sharing::Shared
                    } else {
                        Sharing::Exclusive
                    };
                    region.set_sharing(ordinal, mark);
                }
            }
        })
        .await;
    }
}

/// How old a region directory without a live allocation must be before it
/// is removed (a container just served may not be in the watch yet).
const REGION_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// The region directories (`<pod-uid>_<container>`) under `regions` whose
/// pod has no live allocation on the node, older than [`REGION_GRACE`].
pub fn stale_regions(
    regions: &Path,
    live_pods: &std::collections::BTreeSet<String>,
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
            old && !live_pods.contains(pod)
        })
        .map(|entry| entry.path())
        .collect()
}

/// Removes region directories of pods that are gone, every minute.
pub async fn collect_regions(view: crate::view::NodeView, regions: std::path::PathBuf) {
    let mut ticks = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        ticks.tick().await;
        view.ready().await;
        let live: std::collections::BTreeSet<String> = view
            .allocations()
            .into_iter()
            .filter(|a| {
                !matches!(
                    a.status.as_ref().and_then(|s| s.phase),
                    Some(AllocationPhase::Released | AllocationPhase::Failed)
                )
            })
            .map(|a| a.spec.pod_uid)
            .collect();
        let root = regions.clone();
        let removed = tokio::task::spawn_blocking(move || {
            stale_regions(&root, &live)
                .into_iter()
                .filter(|dir| std::fs::remove_dir_all(dir).is_ok())
                .count()
        })
        .await
        .unwrap_or(0);
        if removed > 0 {
            tracing::info!(removed, "removed region directories of pods that are gone");
        }
    }
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub mod arbiter;

#[cfg(test)]
mod tests;
