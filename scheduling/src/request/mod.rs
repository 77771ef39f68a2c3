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
mod config;
mod container;
mod family;
#[cfg(any(test, feature = "testing"))]
mod fixtures;
mod pod;
mod quota;
mod shown;
mod types;
mod vendors;
mod weights;
mod whole;

#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vendor_tests;

pub use annotations::{
    MAX_LIST_BYTES, MAX_LIST_ENTRIES, MAX_LIST_ENTRY_BYTES, PodOptions, parse_gpu_policy,
};
pub use config::{RequestConfig, ResourceNames};
pub use family::biren::config::BirenConfig;
pub use family::vastai::config::VastaiConfig;
pub use family::{
    Annotations, Binding, Family, Handoff, NodeDevice, Parsed, Quota, Registry, Source, SourceKind,
    container_order, drs_profile, lock_time, mutex_held_by, mutex_value,
};
#[cfg(any(test, feature = "testing"))]
pub use fixtures::{vendor_config, vnpu_chip};
pub use pod::parse_pod;
pub use quota::{LIMITS_PREFIX, QuotaResource};
pub use types::{
    ContainerKind, ContainerRequest, DeviceFilters, DrsAsk, MAX_GPUS_PER_CONTAINER, MAX_MEMORY_MIB,
    MemoryRequest, PodRequest, QuotaNames, VendorRequest, Wording,
};
pub use vendors::{
    AmdConfig, AwsNeuronConfig, CambriconConfig, EnflameConfig, HygonConfig, IluvatarConfig,
    KunlunConfig, MetaxConfig, MthreadsConfig, VnpuConfig, VnpuTemplate, VnpusConfig,
};
pub use weights::{ScoringWeights, parse as parse_scoring_weights};
