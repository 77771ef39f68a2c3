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
            let usage = read_usage(&regions);
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

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
