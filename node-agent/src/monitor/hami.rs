//! The series HAMi's vGPU monitor exports, under its names, label names and
//! help texts, so HAMi dashboards and alerts work unchanged.
//!
//! The names and labels are HAMi v2.9.0's (`cmd/vGPUmonitor/metrics.go`):
//! every series carries `zone="vGPU"` (HAMi registers its collector through
//! `prometheus.WrapRegistererWith({"zone": "vGPU"})`), and with
//! `--legacy-metrics` the same values are exported a second time under the
//! names and labels of HAMi before v2.9 (HAMi's `--legacy-metrics`, which also
//! keeps the new names). Two more, `hami_vgpu_core_used_percent` and
//! `hami_vgpu_core_limit_percent`, are the ones HAMi's tuning guide queries
//! (HAMi's monitor has no such series); they carry v2.9's container labels
//! and have no legacy names. Only what Tessera measures is exported; docs/node-agent.md
//! lists the HAMi series left out and why, and a test keeps that table and
//! this module in step. Label fields are in alphabetical order, the order
//! HAMi's Go client writes them.

use std::{fmt::Debug, hash::Hash};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

/// The value of the `zone` label on every HAMi series.
pub const ZONE: &str = "vGPU";

/// One physical GPU, as HAMi's host series name it.
pub struct HostKey<'a> {
    /// The GPU's index on the node.
    pub index: u32,
    /// The GPU's UUID.
    pub uuid: &'a str,
    /// The model name (HAMi's `device_type` is `NVIDIA-` and this).
    pub model: &'a str,
}

/// One device of one container, as HAMi's per-container series name it.
pub struct ContainerKey<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod.
    pub pod: &'a str,
    /// The container.
    pub container: &'a str,
    /// The device's CUDA ordinal inside the container.
    pub vdevice: usize,
    /// The GPU's UUID.
    pub uuid: &'a str,
}

fn device_type(model: &str) -> String {
    format!("NVIDIA-{model}")
}

/// What a label set needs to be one.
trait Labels: EncodeLabelSet + Clone + Debug + Hash + Eq + Send + Sync + 'static {}
impl<T: EncodeLabelSet + Clone + Debug + Hash + Eq + Send + Sync + 'static> Labels for T {}

/// A naming scheme: the series' names and help texts and its label sets.
trait Scheme {
    /// Labels of a per-GPU series.
    type Host: Labels;
    /// Labels of a per-container series.
    type Container: Labels;
    /// `[name, help]` of each series.
    const NAMES: Names;
    fn host(key: &HostKey<'_>) -> Self::Host;
    fn container(key: &ContainerKey<'_>) -> Self::Container;
}

/// Name and help text of each series.
struct Names {
    host_memory_used: [&'static str; 2],
    host_utilization: [&'static str; 2],
    memory_used: [&'static str; 2],
    memory_limit: [&'static str; 2],
    last_kernel: [&'static str; 2],
    /// The tuning guide's compute series (HAMi's tuning guide names them;
    /// HAMi's monitor does not export them): only under v2.9's labels.
    core_used: Option<[&'static str; 2]>,
    core_limit: Option<[&'static str; 2]>,
}

/// HAMi v2.9's names and labels.
struct Current;

/// Labels of v2.9's per-GPU series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    device_index: String,
    device_type: String,
    device_uuid: String,
    zone: &'static str,
}

/// Labels of v2.9's per-container series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerLabels {
    container: String,
    device_uuid: String,
    namespace: String,
    pod: String,
    vdevice_index: String,
    zone: &'static str,
}

impl Scheme for Current {
    type Host = HostLabels;
    type Container = ContainerLabels;
    const NAMES: Names = Names {
        host_memory_used: [
            "hami_host_gpu_memory_used_bytes",
            "GPU device memory usage in bytes",
        ],
        host_utilization: [
            "hami_host_gpu_utilization_ratio",
            "GPU core utilization ratio (0-100)",
        ],
        memory_used: [
            "hami_vgpu_memory_used_bytes",
            "vGPU device memory usage in bytes",
        ],
        memory_limit: [
            "hami_vgpu_memory_limit_bytes",
            "vGPU device memory limit in bytes",
        ],
        last_kernel: [
            "hami_container_last_kernel_elapsed_seconds",
            "Seconds since last kernel execution in container",
        ],
        core_used: Some([
            "hami_vgpu_core_used_percent",
            "vGPU compute use, percent of the GPU's SMs (the interposer's measured GPU time)",
        ]),
        core_limit: Some([
            "hami_vgpu_core_limit_percent",
            "vGPU compute limit, percent of the GPU's SMs (100 for none)",
        ]),
    };

    fn host(key: &HostKey<'_>) -> HostLabels {
        HostLabels {
            device_index: key.index.to_string(),
            device_type: device_type(key.model),
            device_uuid: key.uuid.to_owned(),
            zone: ZONE,
        }
    }

    fn container(key: &ContainerKey<'_>) -> ContainerLabels {
        ContainerLabels {
            container: key.container.to_owned(),
            device_uuid: key.uuid.to_owned(),
            namespace: key.namespace.to_owned(),
            pod: key.pod.to_owned(),
            vdevice_index: key.vdevice.to_string(),
            zone: ZONE,
        }
    }
}

/// The names and labels of HAMi before v2.9 (`--legacy-metrics`).
struct Legacy;

/// Labels of the legacy per-GPU series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LegacyHostLabels {
    deviceidx: String,
    devicetype: String,
    deviceuuid: String,
    zone: &'static str,
}

/// Labels of the legacy per-container series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LegacyContainerLabels {
    ctrname: String,
    deviceuuid: String,
    podname: String,
    podnamespace: String,
    vdeviceid: String,
    zone: &'static str,
}

impl Scheme for Legacy {
    type Host = LegacyHostLabels;
    type Container = LegacyContainerLabels;
    const NAMES: Names = Names {
        host_memory_used: ["HostGPUMemoryUsage", "GPU device memory usage"],
        host_utilization: ["HostCoreUtilization", "GPU core utilization"],
        memory_used: ["vGPU_device_memory_usage_in_bytes", "vGPU device usage"],
        memory_limit: ["vGPU_device_memory_limit_in_bytes", "vGPU device limit"],
        last_kernel: [
            "Device_last_kernel_of_container",
            "Container device last kernel description",
        ],
        core_used: None,
        core_limit: None,
    };

    fn host(key: &HostKey<'_>) -> LegacyHostLabels {
        LegacyHostLabels {
            deviceidx: key.index.to_string(),
            devicetype: device_type(key.model),
            deviceuuid: key.uuid.to_owned(),
            zone: ZONE,
        }
    }

    fn container(key: &ContainerKey<'_>) -> LegacyContainerLabels {
        LegacyContainerLabels {
            ctrname: key.container.to_owned(),
            deviceuuid: key.uuid.to_owned(),
            podname: key.pod.to_owned(),
            podnamespace: key.namespace.to_owned(),
            vdeviceid: key.vdevice.to_string(),
            zone: ZONE,
        }
    }
}

/// Which of a GPU's series a value goes to.
#[derive(Clone, Copy, Debug)]
pub enum HostSeries {
    /// Device memory in use on the GPU, bytes.
    MemoryUsed,
    /// The GPU's utilisation, percent.
    Utilization,
}

/// Which of a container device's series a value goes to.
#[derive(Clone, Copy, Debug)]
pub enum ContainerSeries {
    /// Device memory the container's processes hold, bytes.
    MemoryUsed,
    /// The container's device memory limit, bytes.
    MemoryLimit,
    /// Seconds since the container last launched a kernel on the device.
    LastKernel,
    /// The container's compute use on the device, percent of its SMs.
    CoreUsed,
    /// The container's compute limit on the device, percent of its SMs.
    CoreLimit,
}

/// One scheme's families in a registry.
struct Families<S: Scheme> {
    host_memory_used: Family<S::Host, Gauge>,
    host_utilization: Family<S::Host, Gauge>,
    memory_used: Family<S::Container, Gauge>,
    memory_limit: Family<S::Container, Gauge>,
    last_kernel: Family<S::Container, Gauge>,
    core_used: Option<Family<S::Container, Gauge>>,
    core_limit: Option<Family<S::Container, Gauge>>,
}

impl<S: Scheme> Families<S> {
    fn register(registry: &mut Registry) -> Self {
        fn family<L: Labels>(registry: &mut Registry, [name, help]: [&str; 2]) -> Family<L, Gauge> {
            let family = Family::<L, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        }
        let names = S::NAMES;
        Self {
            host_memory_used: family(registry, names.host_memory_used),
            host_utilization: family(registry, names.host_utilization),
            memory_used: family(registry, names.memory_used),
            memory_limit: family(registry, names.memory_limit),
            last_kernel: family(registry, names.last_kernel),
            core_used: names.core_used.map(|n| family(registry, n)),
            core_limit: names.core_limit.map(|n| family(registry, n)),
        }
    }

    fn host(&self, key: &HostKey<'_>, series: HostSeries, value: i64) {
        let family = match series {
            HostSeries::MemoryUsed => &self.host_memory_used,
            HostSeries::Utilization => &self.host_utilization,
        };
        family.get_or_create(&S::host(key)).set(value);
    }

    fn container(&self, key: &ContainerKey<'_>, series: ContainerSeries, value: i64) {
        let family = match series {
            ContainerSeries::MemoryUsed => Some(&self.memory_used),
            ContainerSeries::MemoryLimit => Some(&self.memory_limit),
            ContainerSeries::LastKernel => Some(&self.last_kernel),
            ContainerSeries::CoreUsed => self.core_used.as_ref(),
            ContainerSeries::CoreLimit => self.core_limit.as_ref(),
        };
        if let Some(family) = family {
            family.get_or_create(&S::container(key)).set(value);
        }
    }
}

/// HAMi's series in a registry: v2.9's always, the legacy ones on request.
pub struct Hami {
    current: Families<Current>,
    legacy: Option<Families<Legacy>>,
}

impl Hami {
    /// Registers the series in `registry`; with `legacy`, the pre-v2.9
    /// names too (both carry the same values).
    pub fn register(registry: &mut Registry, legacy: bool) -> Self {
        let current = Families::register(registry);
        let legacy = legacy.then(|| Families::register(registry));
        Self { current, legacy }
    }

    /// Sets one of a GPU's series.
    pub fn host(&self, key: &HostKey<'_>, series: HostSeries, value: i64) {
        self.current.host(key, series, value);
        if let Some(legacy) = &self.legacy {
            legacy.host(key, series, value);
        }
    }

    /// Sets one of a container device's series.
    pub fn container(&self, key: &ContainerKey<'_>, series: ContainerSeries, value: i64) {
        self.current.container(key, series, value);
        if let Some(legacy) = &self.legacy {
            legacy.container(key, series, value);
        }
    }
}

#[cfg(test)]
mod tests;
