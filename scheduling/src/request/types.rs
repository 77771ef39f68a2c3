//! The typed request [`parse_pod`](super::parse_pod) gives: per container,
//! what it asks of which family, and the bounds every reader enforces.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::annotations::PodOptions;
use tessera_api::v1alpha1::{DeviceFamily, Sharing};

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
    /// How a rejection names the devices and the filters' annotations.
    pub wording: Wording,
    /// Ascend: the pod asked for HAMi's soft split
    /// (`huawei.com/vnpu-mode: hami-core`), so only nodes running
    /// hami-vnpu-core fit, and cores count in percent.
    pub soft_split: bool,
    /// Ascend 910C in a SuperPod: NPUs come in module pairs (indexes 2k, 2k+1).
    pub pairs: bool,
    /// Ascend 910: choose NPUs on as few networks (`NetworkID`) as possible
    /// (Vastai: dies on as few cards).
    pub by_network: bool,
    /// Vastai dies: under the pod's `mutex` policy a device is busy while
    /// any device of its network (the die's card) holds a slice (HAMi's
    /// `occupiedAIC`).
    pub mutex_by_network: bool,
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

/// How a rejection names a container's devices and the annotations behind
/// its filters: its family's words, which the family's reader sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wording {
    /// What one device is called (`DCU`, `Ascend910B4 NPU`).
    pub noun: Cow<'static, str>,
    /// The annotation of the type filter (empty where the family has none).
    pub use_type: &'static str,
    /// The annotation of the type exclusion (empty where the family has none).
    pub nouse_type: &'static str,
    /// The annotation of the UUID filter.
    pub use_uuid: Cow<'static, str>,
    /// The annotation of the UUID exclusion.
    pub nouse_uuid: Cow<'static, str>,
}

impl Wording {
    /// NVIDIA GPUs (HAMi's `nvidia.com/use-gputype` and the rest).
    pub const NVIDIA: Self = Self::new(
        "GPU",
        [
            tessera_api::names::annotations::USE_GPU_TYPE,
            tessera_api::names::annotations::NOUSE_GPU_TYPE,
        ],
        [
            tessera_api::names::annotations::USE_GPU_UUID,
            tessera_api::names::annotations::NOUSE_GPU_UUID,
        ],
    );

    /// `noun` with the type filters `[use, nouse]` (empty: none) and the
    /// UUID filters `[use, nouse]`.
    pub const fn new(
        noun: &'static str,
        [use_type, nouse_type]: [&'static str; 2],
        [use_uuid, nouse_uuid]: [&'static str; 2],
    ) -> Self {
        Self {
            noun: Cow::Borrowed(noun),
            use_type,
            nouse_type,
            use_uuid: Cow::Borrowed(use_uuid),
            nouse_uuid: Cow::Borrowed(nouse_uuid),
        }
    }
}

/// A pod's device filters for one family, from its annotations, each list
/// within the bounds of [`MAX_LIST_ENTRIES`](super::MAX_LIST_ENTRIES).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceFilters {
    /// Only devices whose type contains one of these (case-insensitive:
    /// lowercased at parse); empty: any.
    pub use_types: Vec<String>,
    /// Devices whose type contains one of these (case-insensitive:
    /// lowercased at parse) are excluded.
    pub nouse_types: Vec<String>,
    /// Only these device UUIDs; empty: any.
    pub use_uuids: BTreeSet<String>,
    /// These device UUIDs are excluded.
    pub nouse_uuids: BTreeSet<String>,
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

/// The quota names a container's slices count against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaNames<'a> {
    /// The memory resource, and MiB per unit of it.
    pub memory: Option<(&'a str, u64)>,
    /// The core resource.
    pub cores: Option<&'a str>,
}
