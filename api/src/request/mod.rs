//! From a Pod and the cluster defaults to a typed GPU request.
//!
//! The webhook and the extender (Filter, Prioritize and Bind) all read pods
//! through [`parse_pod`], so they agree on what a pod asked for. (The node
//! agent never parses a pod: it serves what Bind wrote in the pod's
//! VgpuAllocation.) The rules are HAMi's:
//!
//! - A container asks for GPUs with `resources.limits` (requests are read when
//!   a limit is absent; limits win when both are set).
//! - `nvidia.com/gpu` is the number of vGPUs, each on a different GPU. When it
//!   is absent but `gpumem`, `gpumem-percentage` or `gpucores` is present, the
//!   container gets `defaultGpuNum` vGPUs.
//! - `nvidia.com/gpumem` (MiB) and `nvidia.com/gpumem-percentage` (1-100) are
//!   mutually exclusive; with neither, memory is `defaultMemory` MiB, where 0
//!   means the whole device.
//! - `nvidia.com/gpucores` is 0-100 percent of the SMs, default `defaultCores`.
//!   A container that asks for a whole device's memory and says nothing about
//!   cores gets 100 cores: the device is its alone (HAMi ≥ 2.10 behaviour).
//! - Quantities must be whole numbers within sane bounds; anything else is an
//!   error naming the container, the resource and the rule.
//!
//! Init containers and sidecars: regular init containers, sidecars (init
//! containers with `restartPolicy: Always`) and app containers may all ask for
//! GPUs. They come out in the order the kubelet starts them and calls the
//! device plugin's `Allocate`: init containers (sidecars among them, in spec
//! order), then app containers. Every container's slices are accounted for the
//! whole life of the pod, so a GPU is never promised to two running containers
//! at once, at the cost of holding an init container's slice after it exits.
//!
//! Pods that ask for no GPU give `Ok(None)` and their annotations are not read.

mod annotations;
mod ascend;
mod config;
mod container;
mod enflame;
mod iluvatar;
mod kunlun;
mod metax;
mod mthreads;
mod neuron;
mod simple;
mod vendors;
mod whole;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod vendor_tests;

use k8s_openapi::api::core::v1::Pod;

use crate::{Error, Result, Violations};

pub use annotations::PodOptions;
pub use config::{RequestConfig, ResourceNames};
pub use enflame::drs_profile;
pub use vendors::{
    AmdConfig, AwsNeuronConfig, CambriconConfig, EnflameConfig, HygonConfig, IluvatarConfig,
    KunlunConfig, MetaxConfig, MthreadsConfig, VnpuConfig, VnpuTemplate, VnpusConfig,
};

use crate::v1alpha1::{DeviceFamily, Sharing};

/// Largest number of vGPUs one container may ask for.
pub const MAX_GPUS_PER_CONTAINER: u32 = 64;
/// Largest memory one vGPU may ask for, in MiB (16 TiB).
pub const MAX_MEMORY_MIB: u64 = 16 << 20;

/// What a pod asks for: its GPU containers and the pod-level options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRequest {
    /// Containers that ask for at least one vGPU, in kubelet start order.
    pub containers: Vec<ContainerRequest>,
    /// Placement options from the pod's annotations.
    pub options: PodOptions,
}

/// One container's GPU request, with defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRequest {
    /// The container's name.
    pub name: String,
    /// Whether it is an init container, a sidecar or an app container.
    pub kind: ContainerKind,
    /// Number of vGPUs, each on a different GPU.
    pub count: u32,
    /// Device memory per vGPU.
    pub memory: MemoryRequest,
    /// Percent of SMs per vGPU; 100 means exclusive.
    pub cores: u32,
    /// Compute-limiter priority (0 high, 1 low), when given.
    pub priority: Option<u32>,
    /// The accelerator family the request is for. A container asking for
    /// several families gives one request per family, in the order
    /// NVIDIA, Hygon, Ascend, Iluvatar, Cambricon, Moore Threads, MetaX
    /// (whole GPUs, then sGPUs), Enflame, Kunlunxin (whole XPUs, then
    /// vXPUs), AMD, AWS Neuron.
    pub family: DeviceFamily,
    /// What a request for another vendor's devices adds; `None` for NVIDIA.
    pub vendor: Option<VendorRequest>,
}

/// The vendor-specific part of a request for a family other than NVIDIA.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VendorRequest {
    /// The device type the devices must have, exactly (Ascend's chip
    /// `Ascend910B4`); `None`: any device of the family.
    pub device_type: Option<String>,
    /// The vendor template the memory was rounded up to (Ascend `vir04`).
    pub template: Option<String>,
    /// The pod's type and UUID filters for this family.
    pub filters: DeviceFilters,
    /// Ascend: the pod asked for HAMi's soft split
    /// (`huawei.com/vnpu-mode: hami-core`), so only nodes running
    /// hami-vnpu-core fit, and cores count in percent.
    pub soft_split: bool,
    /// Ascend 910C in a SuperPod: NPUs come in module pairs (indexes 2k, 2k+1).
    pub pairs: bool,
    /// Ascend 910: choose NPUs on as few networks (`NetworkID`) as possible.
    pub by_network: bool,
    /// Moore Threads: every container of the pod shares the card(s) of the
    /// first one (HAMi's `customFilterRule`).
    pub one_card_per_pod: bool,
    /// MetaX exclusive sGPUs: GPUs from the smallest MetaLink (the device's
    /// network) that has enough, else across MetaLinks from the smallest,
    /// then GPUs on none (HAMi's `prioritizeExclusiveDevices`).
    pub by_link_zone: bool,
    /// Kunlunxin: XPUs within one wing of four (0-3, 4-7) or linked across
    /// wings (HAMi's `graghSelect`).
    pub by_wing: bool,
    /// Kunlunxin vXPUs: a card holds vXPUs of one size only (HAMi's
    /// `FitVXPU`).
    pub same_size: bool,
    /// AWS Neuron: more than one device are consecutive free devices (a
    /// ring on Inferentia, aligned blocks on Trainium; HAMi's
    /// `graphSelect`).
    pub contiguous: bool,
    /// AWS Neuron: the container named NeuronCores, so each slice records
    /// which cores it holds and the plugin is handed core numbers.
    pub by_core_index: bool,
    /// Enflame: the DRS partition asked for, chosen among each device's
    /// profiles by the engine.
    pub drs: Option<DrsAsk>,
    /// MetaX sGPUs: the pod's app class and QoS policy, under HAMi's
    /// co-location rules (`checkAppClass`, `checkDeviceQos`); `None` for
    /// every other request.
    pub sharing: Option<Sharing>,
    /// MetaX exclusive sGPUs: nodes are scored by how well the GPUs keep
    /// MetaLinks whole (HAMi's `scoreExclusiveDevices`), from the pod's
    /// `metax-tech.com/sgpu-topology-aware` or the configuration.
    pub topology_aware: bool,
}

/// An Enflame DRS partition a container asks for (HAMi's two request
/// modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrsAsk {
    /// `enflame.com/drs-gcu`: the profile of exactly this many slices.
    Slices(u32),
    /// `enflame.com/gcu-memory` / `gcu-core`: the smallest profile with at
    /// least this memory (GB; MiB when above twice the largest profile's
    /// GB, as HAMi reads it) and this percent of the cores (0: any).
    Spec {
        /// The memory asked for, as written (0: any).
        memory: u64,
        /// Percent of the cores (0: any).
        cores: u32,
    },
}

/// A pod's device filters for one family, from its annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceFilters {
    /// Only devices whose type contains one of these (case-insensitive); empty: any.
    pub use_types: Vec<String>,
    /// Devices whose type contains one of these (case-insensitive) are excluded.
    pub nouse_types: Vec<String>,
    /// Only these device UUIDs; empty: any.
    pub use_uuids: Vec<String>,
    /// These device UUIDs are excluded.
    pub nouse_uuids: Vec<String>,
}

/// Where a container sits in the pod's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerKind {
    /// A regular init container: runs to completion before app containers start.
    Init,
    /// An init container with `restartPolicy: Always`: runs beside app containers.
    Sidecar,
    /// An app container.
    App,
}

/// Device memory per vGPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryRequest {
    /// An absolute amount in MiB.
    Mib(u64),
    /// A percentage (1-100) of the device's schedulable memory.
    Percent(u32),
}

impl MemoryRequest {
    /// The MiB this request takes from a device offering `capacity_mib`.
    pub fn resolve(self, capacity_mib: u64) -> u64 {
        match self {
            Self::Mib(mib) => mib,
            // In 128 bits: a capacity above u64::MAX / 100 (any u64 a
            // GpuNode may carry) must not overflow. The result is at most
            // `capacity_mib`, so it fits back in a u64.
            Self::Percent(percent) => {
                let mib = u128::from(capacity_mib) * u128::from(percent.min(100)) / 100;
                u64::try_from(mib).unwrap_or(capacity_mib)
            }
        }
    }

    /// Whether this asks for the whole device.
    pub fn is_whole_device(self) -> bool {
        self == Self::Percent(100)
    }
}

/// Parses a pod's GPU request; `Ok(None)` when it asks for no GPU.
///
/// Every broken rule is reported, not just the first, in
/// [`Error::InvalidPodRequest`].
pub fn parse_pod(pod: &Pod, config: &RequestConfig) -> Result<Option<PodRequest>> {
    let mut violations = Vec::new();
    let mut containers = Vec::new();
    if let Some(spec) = &pod.spec {
        let init = spec.init_containers.iter().flatten().map(|c| {
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            (
                c,
                if sidecar {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                },
            )
        });
        let app = spec.containers.iter().map(|c| (c, ContainerKind::App));
        let annotations = pod.metadata.annotations.as_ref();
        for (container, kind) in init.chain(app) {
            let mut collect = |parsed: Result<Option<ContainerRequest>, Vec<_>>| match parsed {
                Ok(Some(request)) => containers.push(request),
                Ok(None) => {}
                Err(mut found) => violations.append(&mut found),
            };
            collect(container::parse(container, kind, config));
            if let Some(hygon) = &config.hygon {
                collect(simple::parse(
                    container,
                    kind,
                    &simple::Simple::hygon(hygon),
                    annotations,
                ));
            }
            for chip in config.vnpus.iter().flat_map(|v| &v.configs) {
                collect(ascend::parse(container, kind, chip, annotations));
            }
            for chip in &config.iluvatars {
                collect(iluvatar::parse(container, kind, chip, annotations));
            }
            if let Some(mlu) = &config.cambricon {
                collect(simple::parse(
                    container,
                    kind,
                    &simple::Simple::cambricon(mlu),
                    annotations,
                ));
            }
            if let Some(mt) = &config.mthreads {
                collect(mthreads::parse(container, kind, mt, annotations));
            }
            if let Some(metax) = &config.metax {
                collect(metax::parse_gpu(container, kind, metax));
                collect(metax::parse_sgpu(container, kind, metax, annotations));
            }
            if let Some(gcu) = &config.enflame {
                collect(enflame::parse(container, kind, gcu));
                collect(enflame::parse_drs(container, kind, gcu));
            }
            if let Some(xpu) = &config.kunlun {
                collect(kunlun::parse_xpu(container, kind, xpu, annotations));
                collect(kunlun::parse_vxpu(container, kind, xpu, annotations));
            }
            if let Some(amd) = &config.amd {
                collect(simple::parse(
                    container,
                    kind,
                    &simple::Simple::amd(amd),
                    annotations,
                ));
            }
            if let Some(neuron) = &config.awsneuron {
                collect(neuron::parse(container, kind, neuron, annotations));
            }
        }
    }
    if containers.is_empty() && violations.is_empty() {
        return Ok(None);
    }
    let annotations = pod.metadata.annotations.as_ref();
    let options = annotations::parse(annotations, &mut violations);
    if !violations.is_empty() {
        return Err(Error::InvalidPodRequest(Violations(violations)));
    }
    Ok(Some(PodRequest {
        containers,
        options,
    }))
}
