//! `GpuNode`: one node's GPUs as its node agent sees them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    CorePolicy, DeviceFamily, DeviceHealth, FrontDoor, MigStrategy, OperatingMode, QosPolicy,
};
use super::gpu_node_config::FilterDevices;
use super::mig::{MigInstance, MigLayout};

/// A node's GPU inventory. Cluster-scoped, named after the Node, owned by it.
///
/// GpuNode has no desired state: the node agent observes the node and writes
/// everything into `status`. Liveness of the agent is its coordination Lease,
/// not this object.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuNode",
    plural = "gpunodes",
    shortname = "gpun",
    category = "tessera",
    status = "GpuNodeStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "A node's GPUs as its Tessera node agent sees them: inventory, capacity after scaling, health and the configuration applied.",
    printcolumn(
        name = "GPUs",
        type_ = "integer",
        json_path = ".status.gpuCount",
        description = "Number of GPUs on the node"
    ),
    printcolumn(
        name = "Model",
        type_ = "string",
        json_path = ".status.models",
        description = "GPU models on the node"
    ),
    printcolumn(
        name = "Memory",
        type_ = "integer",
        json_path = ".status.capacity.memoryMiB",
        description = "Schedulable device memory in MiB, after scaling"
    ),
    printcolumn(
        name = "Slices",
        type_ = "integer",
        json_path = ".status.capacity.slices",
        description = "vGPU slices the node offers",
        priority = "1"
    ),
    printcolumn(
        name = "Door",
        type_ = "string",
        json_path = ".status.frontDoor",
        description = "How pods reach the GPUs now: devicePlugin or dra"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the agent reports the node ready for GPU work"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct GpuNodeSpec {}

/// What the node agent observed on the node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// The GPUs the agent exposes, after the configuration's device filter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["uuid"]))]
    pub devices: Vec<GpuDevice>,
    /// Number of entries in `devices`.
    #[serde(default)]
    pub gpu_count: u32,
    /// The distinct GPU models on the node, comma-separated, for display.
    #[serde(default)]
    pub models: String,
    /// Schedulable totals over all healthy devices, after scaling.
    #[serde(default)]
    pub capacity: CapacitySummary,
    /// Totals held by live allocations. Written for people reading `kubectl`;
    /// schedulers never read it back (usage is always the fold of allocations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<CapacitySummary>,
    /// The effective settings: cluster defaults overridden by matching GpuNodeConfigs.
    #[serde(default)]
    pub settings: NodeSettings,
    /// The door the agent serves the GPUs through now: the device plugin
    /// (HAMi's pod API) or DRA.
    #[serde(default)]
    pub front_door: FrontDoor,
    /// How well taking some number of whole devices keeps the node's
    /// topology, as the vendor's plugin computes it (MetaX's
    /// `metax-tech.com/gpu.topology.losses` and `scores`); nodes are
    /// compared by them first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub placement_scores: Vec<PlacementScore>,
    /// Names of the GpuNodeConfig objects that contributed to `settings`, lowest precedence first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_configs: Vec<String>,
    /// Standard conditions; `Ready` is true when the agent serves the kubelet;
    /// `FrontDoor` is false while a switch of door waits for the node's
    /// allocations to end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl GpuNodeStatus {
    /// A status listing `devices` with their count, their models (sorted,
    /// comma-separated, once each) and their capacity summed; nothing else.
    pub fn of_devices(devices: Vec<GpuDevice>) -> Self {
        let mut models: Vec<&str> = devices.iter().map(|d| d.model.as_str()).collect();
        models.sort_unstable();
        models.dedup();
        Self {
            gpu_count: u32::try_from(devices.len()).unwrap_or(u32::MAX),
            models: models.join(","),
            capacity: CapacitySummary {
                memory_mib: devices.iter().map(|d| d.capacity.memory_mib).sum(),
                cores: devices.iter().map(|d| d.capacity.cores).sum(),
                slices: devices.iter().map(|d| d.split_count).sum(),
            },
            devices,
            ..Self::default()
        }
    }
}

/// What the vendor's plugin says about a pod taking `devices` whole devices
/// of the node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementScore {
    /// How many whole devices the pod takes.
    pub devices: u32,
    /// The topology lost by taking them: under the binpack node policy,
    /// nodes that lose less are preferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<i64>,
    /// How good taking them is: under the spread node policy, nodes that
    /// score higher are preferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<i64>,
}

/// One physical GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuDevice {
    /// The GPU's UUID as NVML reports it, e.g. `GPU-5c4e0ad5-...`.
    #[schemars(length(min = 1, max = 128))]
    pub uuid: String,
    /// The GPU's index on the node (NVML order).
    pub index: u32,
    /// The accelerator family; absent means `nvidia`. Devices of other
    /// families are read by the controller from what their vendor's device
    /// plugin reports on the Node (docs/vendors.md).
    #[serde(default, skip_serializing_if = "DeviceFamily::is_nvidia")]
    pub family: DeviceFamily,
    /// The network the device is on, where its vendor reports one (Ascend
    /// 910's `NetworkID`, MetaX's MetaLink `linkZone`, the card a Vastai die
    /// sits on, numbered in register order): devices of a
    /// multi-device container are taken from as few networks as possible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_id: Option<u32>,
    /// The model name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub model: String,
    /// Physical device memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// What the scheduler may hand out on this GPU, after scaling.
    pub capacity: DeviceCapacity,
    /// How many vGPU slices may share this GPU at once.
    pub split_count: u32,
    /// The NUMA node the GPU is attached to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// UUIDs of GPUs connected to this one by NVLink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<String>,
    /// The CUDA compute capability, `major.minor` (e.g. `9.0`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub compute_capability: Option<String>,
    /// The NVIDIA driver's version (e.g. `550.54.15`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub driver_version: Option<String>,
    /// Whether the GPU can take new work.
    pub health: DeviceHealth,
    /// Why the GPU is unhealthy (e.g. the XID error), when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_message: Option<String>,
    /// Who cordoned the device, when it takes no new slice although healthy:
    /// `hami.io/device-cordon` (the Node's annotation) or `GpuNodeConfig/<name>`
    /// (its `cordonDevices`). Slices it holds are untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 300))]
    pub cordoned_by: Option<String>,
    /// How the GPU is shared.
    pub mode: OperatingMode,
    /// MIG instances that exist on this GPU, when `mode` is `mig`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub mig_instances: Vec<MigInstance>,
    /// What the GPU can be cut into, when Tessera creates MIG instances on
    /// demand (dynamic MIG: `mode` is `mig` and `migStrategy` is `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigLayout>,
    /// The partitions another vendor's plugin cuts the device into, where
    /// the vendor has them (Enflame DRS `3g.20gb`: 3 of the device's slices,
    /// 20 GB), with the plugin's id for each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub profiles: Vec<DeviceProfile>,
    /// The device's minor number, where the vendor's plugin is handed it
    /// (Enflame DRS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub minor: Option<String>,
    /// The QoS policy the vendor's plugin reports the device runs under
    /// (MetaX sGPUs' `qosPolicy`): a shared device takes only sGPUs of its
    /// policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_policy: Option<QosPolicy>,
}

/// One partition profile of a vendor's device.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceProfile {
    /// The profile's name, e.g. `3g.20gb`.
    #[schemars(length(min = 1, max = 32))]
    pub name: String,
    /// The plugin's id of the profile.
    #[schemars(length(max = 32))]
    pub id: String,
}

/// Schedulable capacity of one GPU.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCapacity {
    /// Device memory in MiB: physical memory × memory scaling.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Compute in percent of the SMs: 100 × core scaling.
    pub cores: u32,
}

/// Totals over a node's GPUs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacitySummary {
    /// Device memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Compute in percent of one GPU's SMs (a node with 4 GPUs offers 400).
    pub cores: u32,
    /// vGPU slices.
    pub slices: u32,
}

/// A node's effective GPU settings: the cluster defaults overridden by every
/// GpuNodeConfig that selects the node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSettings {
    /// vGPU slices per GPU.
    pub device_split_count: u32,
    /// Factor applied to physical memory; above 1 oversubscribes memory.
    pub device_memory_scaling: f64,
    /// Factor applied to compute; above 1 oversubscribes compute.
    pub device_core_scaling: f64,
    /// How the node's GPUs are shared.
    pub operating_mode: OperatingMode,
    /// How MIG devices are exposed.
    pub mig_strategy: MigStrategy,
    /// The MIG profiles dynamic MIG may create (e.g. `1g.10gb`); empty:
    /// every profile of the GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_profiles: Vec<String>,
    /// GPUs the agent leaves out.
    #[serde(default)]
    pub filter_devices: FilterDevices,
    /// GPUs that take no new pod (`cordonDevices` of the configs).
    #[serde(default, skip_serializing_if = "FilterDevices::is_empty")]
    pub cordon_devices: FilterDevices,
    /// The front door the configs ask for; `GpuNodeStatus.frontDoor` is the
    /// one the agent serves (they differ while a switch waits).
    #[serde(default)]
    pub front_door: FrontDoor,
    /// Interposer log level (0-4) given to containers.
    pub lib_cuda_log_level: u8,
    /// When compute limits apply in containers.
    pub gpu_core_policy: CorePolicy,
}

impl Default for NodeSettings {
    /// HAMi's defaults: 10 slices per GPU, no scaling, hami-core mode.
    fn default() -> Self {
        Self {
            device_split_count: 10,
            device_memory_scaling: 1.0,
            device_core_scaling: 1.0,
            operating_mode: OperatingMode::HamiCore,
            mig_strategy: MigStrategy::None,
            mig_profiles: Vec::new(),
            filter_devices: FilterDevices::default(),
            cordon_devices: FilterDevices::default(),
            front_door: FrontDoor::DevicePlugin,
            lib_cuda_log_level: 2,
            gpu_core_policy: CorePolicy::Default,
        }
    }
}
