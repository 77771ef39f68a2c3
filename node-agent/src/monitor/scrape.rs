//! One scrape: the `/metrics` text from what the agent knows at that moment.

use std::collections::{BTreeMap, HashMap};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tessera_api::v1alpha1::{CorePolicy, DeviceHealth, GpuDevice, VgpuAllocation};

use super::{
    cores::CoreUse,
    hami::{ContainerKey, ContainerSeries, Hami, HostKey, HostSeries},
    usage::Usage,
};
use crate::{
    backend::HostUsage,
    holders::{live_allocations, users_per_gpu},
};

/// Labels of a per-GPU Tessera series.
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

const MIB: i64 = 1 << 20;
const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Everything one scrape reports on.
#[derive(Clone, Copy, Debug)]
pub struct Scrape<'a> {
    /// This node's name.
    pub node: &'a str,
    /// The devices the node offers (after its settings).
    pub devices: &'a [GpuDevice],
    /// The node's allocations (released and failed ones are skipped).
    pub allocations: &'a [VgpuAllocation],
    /// What the containers' shared regions say.
    pub usage: &'a Usage,
    /// Each container device's compute use over the last window
    /// ([`super::cores::CoreRates`]).
    pub core_use: &'a CoreUse,
    /// The node's `gpuCorePolicy`: with the limits it decides where the
    /// interposer enforces (and so measures) compute.
    pub core_policy: CorePolicy,
    /// How many times each container's region was refused (by region
    /// directory name), since the agent started.
    pub refused: &'a HashMap<String, u64>,
    /// What the backend measured on the GPUs (empty for fake GPUs).
    pub host: &'a [HostUsage],
    /// `CLOCK_MONOTONIC` now, ns: the clock of the regions' launch times.
    pub now_ns: u64,
    /// Whether HAMi's legacy names are exported too.
    pub legacy: bool,
}

/// The metrics text for one scrape.
pub fn render(scrape: &Scrape<'_>) -> String {
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
    let core_used = container(
        &mut registry,
        "tessera_container_core_used_percent",
        "A container's compute use over the last window of at least 5 s, percent of the GPU's \
         SMs, from the GPU time its region records (only where the interposer enforces a compute \
         limit; at most 100)",
    );
    let used = container(
        &mut registry,
        "tessera_container_memory_used_bytes",
        "Device memory a container's processes claim to hold in its shared region (the \
         container can write it: at most its limit is reported)",
    );
    let refused = Family::<ContainerLabels, Counter>::default();
    registry.register(
        "tessera_container_region_refused",
        "Reads or writes of a container's shared region the node agent refused (not a regular \
         file of the region's size, a link, or not a valid region)",
        refused.clone(),
    );
    let hami = Hami::register(&mut registry, scrape.legacy);

    for measured in scrape.host {
        let key = HostKey {
            index: measured.index,
            uuid: &measured.uuid,
            model: &measured.model,
        };
        if let Some(bytes) = measured.memory_used_bytes {
            hami.host(&key, HostSeries::MemoryUsed, gauge(bytes));
        }
        if let Some(percent) = measured.utilization_percent {
            hami.host(&key, HostSeries::Utilization, i64::from(percent));
        }
    }

    let labels: BTreeMap<&str, GpuLabels> = scrape
        .devices
        .iter()
        .map(|d| {
            (
                d.uuid.as_str(),
                GpuLabels {
                    node: scrape.node.to_owned(),
                    uuid: d.uuid.clone(),
                    index: d.index.to_string(),
                    model: d.model.clone(),
                },
            )
        })
        .collect();
    for device in scrape.devices {
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
    let users = users_per_gpu(scrape.allocations);
    for allocation in live_allocations(scrape.allocations) {
        let namespace = allocation.metadata.namespace.as_deref().unwrap_or_default();
        for c in &allocation.spec.containers {
            let dir = allocation.region_name(&c.name);
            // The one SM limit the container's interposer gets (its largest
            // share, as Allocate hands it out).
            let enforced = c.devices.iter().map(|s| s.cores).max().unwrap_or(0);
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
                    namespace: namespace.to_owned(),
                    pod: allocation.spec.pod_name.clone(),
                    container: c.name.clone(),
                    uuid: slice.uuid.clone(),
                    device_index: i.to_string(),
                };
                let theirs = ContainerKey {
                    namespace,
                    pod: &allocation.spec.pod_name,
                    container: &c.name,
                    vdevice: i,
                    uuid: &slice.uuid,
                };
                let bytes = gauge(slice.memory_mib).saturating_mul(MIB);
                limit.get_or_create(&ours).set(bytes);
                hami.container(&theirs, ContainerSeries::MemoryLimit, bytes);
                core_limit.get_or_create(&ours).set(i64::from(slice.cores));
                // HAMi's reading of a limit: no limit is every SM.
                let hami_limit = match slice.cores {
                    0 => 100,
                    cores => cores.min(100),
                };
                hami.container(&theirs, ContainerSeries::CoreLimit, i64::from(hami_limit));
                let shared = users.get(slice.uuid.as_str()).copied().unwrap_or(0) > 1;
                let measured = limits_compute(enforced, scrape.core_policy, shared);
                if let Some(&percent) = scrape.core_use.get(&(dir.clone(), i)).filter(|_| measured)
                {
                    core_used.get_or_create(&ours).set(i64::from(percent));
                    hami.container(&theirs, ContainerSeries::CoreUsed, i64::from(percent));
                }
                if let Some(&count) = scrape.refused.get(&dir) {
                    refused.get_or_create(&ours).inc_by(count);
                }
                let Some(reading) = scrape.usage.get(&(dir.clone(), i)) else {
                    continue; // no CUDA call yet, or its region is refused
                };
                // The container's claim, within its allocation's limit (the
                // interposer never reserves more; a bigger number is a
                // container writing its region).
                let claimed = if bytes > 0 {
                    gauge(reading.used).min(bytes)
                } else {
                    gauge(reading.used)
                };
                used.get_or_create(&ours).set(claimed);
                hami.container(&theirs, ContainerSeries::MemoryUsed, claimed);
                if let Some(at) = reading.launched_at {
                    let seconds = scrape.now_ns.saturating_sub(at) / NANOS_PER_SECOND;
                    hami.container(&theirs, ContainerSeries::LastKernel, gauge(seconds));
                }
            }
        }
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

/// Whether the interposer limits (and so measures) a container's compute
/// on a GPU: an SM limit under 100 %, a policy that applies it, and for the
/// `default` policy a GPU shared with another live allocation (its limiter
/// is `policy/compute/limiter.rs`).
fn limits_compute(cores: u32, policy: CorePolicy, shared: bool) -> bool {
    (1..100).contains(&cores)
        && match policy {
            CorePolicy::Disable => false,
            CorePolicy::Force => true,
            CorePolicy::Default => shared,
        }
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
