//! `GpuNodeConfig`: per-node GPU settings, managed by people or GitOps.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CorePolicy, FrontDoor, MigStrategy, OperatingMode};

/// Overrides the cluster's GPU defaults on the nodes it selects. Cluster-scoped.
///
/// A config selects nodes by `nodeSelector`, by `nodeNames` globs, or both (a
/// node must then match both). Every setting is optional; unset settings fall
/// through to lower-precedence configs and then to the cluster defaults. When
/// several configs select a node, higher `priority` wins; configs of equal
/// priority that set the same key to different values on the same node
/// conflict: the one whose name sorts first wins and the conflict is reported
/// in `status.conflicts`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuNodeConfig",
    plural = "gpunodeconfigs",
    shortname = "gpucfg",
    category = "tessera",
    status = "GpuNodeConfigStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "Per-node GPU settings (HAMi's per-node device-plugin config): slices per GPU, memory and core scaling, operating mode, device filters, for the nodes selected by label selector and/or node-name globs.",
    printcolumn(
        name = "Nodes",
        type_ = "string",
        json_path = ".spec.nodeNames",
        description = "Node-name globs the config selects"
    ),
    printcolumn(
        name = "Selector",
        type_ = "string",
        json_path = ".spec.nodeSelector",
        description = "Label selector the config selects"
    ),
    printcolumn(
        name = "Priority",
        type_ = "integer",
        json_path = ".spec.priority",
        description = "Higher wins when configs overlap",
        priority = "1"
    ),
    printcolumn(
        name = "Split",
        type_ = "integer",
        json_path = ".spec.deviceSplitCount",
        description = "vGPU slices per GPU"
    ),
    printcolumn(
        name = "Mem-Scale",
        type_ = "number",
        json_path = ".spec.deviceMemoryScaling",
        description = "Memory scaling factor"
    ),
    printcolumn(
        name = "Core-Scale",
        type_ = "number",
        json_path = ".spec.deviceCoreScaling",
        description = "Core scaling factor"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.operatingMode",
        description = "Operating mode"
    ),
    printcolumn(
        name = "Door",
        type_ = "string",
        json_path = ".spec.frontDoor",
        description = "How pods reach the GPUs: devicePlugin or dra"
    ),
    printcolumn(
        name = "Matched",
        type_ = "integer",
        json_path = ".status.matchedNodeCount",
        description = "Nodes the config currently selects"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.nodeSelector) || (has(self.nodeNames) && size(self.nodeNames) > 0)").message("set nodeSelector, nodeNames or both: a GpuNodeConfig must select nodes (nodeSelector: {} selects every node)"))]
pub struct GpuNodeConfigSpec {
    /// Nodes whose labels match this selector. `{}` selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Node names or globs (`*` any run of characters, `?` one character),
    /// e.g. `inference-pool-*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("items" = {
        "type": "string",
        "maxLength": 253,
        "x-kubernetes-validations": [{
            "rule": "self.matches('^[a-z0-9*?]([a-z0-9.*?-]*[a-z0-9*?])?$')",
            "message": "must be a node name or a glob of lowercase letters, digits, '-', '.', '*' and '?', e.g. inference-pool-*",
        }],
    }))]
    pub node_names: Vec<String>,
    /// Precedence among configs that select the same node; higher wins. Default 0.
    #[serde(default)]
    pub priority: i32,
    /// vGPU slices per GPU, 1 to 100 (HAMi default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub device_split_count: Option<u32>,
    /// Factor applied to each GPU's physical memory; must be greater than 0.
    /// Above 1 oversubscribes device memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true, "maximum" = 100))]
    pub device_memory_scaling: Option<f64>,
    /// Factor applied to each GPU's compute (100 × factor percent); must be
    /// greater than 0. Above 1 oversubscribes compute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true, "maximum" = 100))]
    pub device_core_scaling: Option<f64>,
    /// How the GPUs are shared: `hami-core`, `mig` or `mps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<OperatingMode>,
    /// Who owns the instances of GPUs in `mig` mode: `none` (dynamic MIG:
    /// Tessera creates them per container), `single` or `mixed` (static MIG:
    /// the operator's instances, offered as `nvidia.com/gpu` or as
    /// `nvidia.com/mig-<profile>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_strategy: Option<MigStrategy>,
    /// The MIG profiles dynamic MIG may create on the node, by name
    /// (`1g.10gb`, `3g.40gb`, `1g.10gb+me`); a request no allowed profile
    /// covers goes elsewhere. Unset or empty: every profile of the GPU
    /// (HAMi 2.10's `migProfileAllowlist`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), inner(regex(pattern = r"^[1-8]g\.[0-9]+gb(\+me)?$")))]
    pub mig_profiles: Option<Vec<String>>,
    /// How pods reach the node's GPUs: `devicePlugin` (HAMi's pod API, the
    /// default) or `dra` (ResourceClaims of DeviceClass `vgpu.tessera.dev`).
    /// The agent switches only while the node holds no allocation; until then
    /// its GpuNode's `FrontDoor` condition says what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front_door: Option<FrontDoor>,
    /// GPUs the node agent must not expose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_devices: Option<FilterDevices>,
    /// GPUs that take no new pod, by UUID or index; pods already on them
    /// keep running (the declarative form of the Node annotation
    /// `hami.io/device-cordon`; the two add up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordon_devices: Option<FilterDevices>,
    /// Interposer log level in containers: 0 (errors) to 4 (debug).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 4))]
    pub lib_cuda_log_level: Option<u8>,
    /// When compute limits apply in containers: `default`, `force` or `disable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_core_policy: Option<CorePolicy>,
}

/// GPUs picked by UUID or by index.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilterDevices {
    /// GPU UUIDs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub uuids: Vec<String>,
    /// GPU indexes on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub indexes: Vec<u32>,
}

impl FilterDevices {
    /// Whether it picks no GPU.
    pub fn is_empty(&self) -> bool {
        self.uuids.is_empty() && self.indexes.is_empty()
    }

    /// Whether it picks the GPU of this UUID and index.
    pub fn picks(&self, uuid: &str, index: u32) -> bool {
        self.uuids.iter().any(|u| u == uuid) || self.indexes.contains(&index)
    }
}

/// What the config currently does.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeConfigStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes the config selects, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matched_nodes: Vec<String>,
    /// Number of entries in `matchedNodes`.
    #[serde(default)]
    pub matched_node_count: u32,
    /// Settings this config and another of equal priority set to different values on a node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<ConfigConflict>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Tuning advice from what the selected nodes were seen doing (HAMi's
    /// tuning guide's decision tree), with its evidence. Advice only: the
    /// controller never changes the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningStatus>,
}

/// Tuning advice for the nodes a config selects, and what it rests on.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TuningStatus {
    /// When the advice was computed (RFC 3339).
    pub computed_at: String,
    /// The observation window, seconds.
    pub window_seconds: u64,
    /// How much of the window the nodes were observed, seconds.
    pub observed_seconds: u64,
    /// GPUs on the selected nodes.
    pub gpus: u32,
    /// The 95th percentile over the window of the memory the containers
    /// held over their limits, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_p95_percent: Option<u32>,
    /// The 95th percentile over the window of the compute the containers
    /// used over their compute limits, percent (containers whose compute is
    /// measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_used_p95_percent: Option<u32>,
    /// Pods that waited over 10 minutes for a GPU on these nodes, by what
    /// the nodes lacked (`slice`, `memory`, `cores`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub waited: Vec<TuningWait>,
    /// The advice, each with the numbers behind it; empty when the guide
    /// advises nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub advice: Vec<TuningAdvice>,
}

/// Pods that waited for a GPU, for one reason.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TuningWait {
    /// What the nodes lacked: `slice`, `memory` or `cores`.
    pub lack: String,
    /// How many pods waited.
    pub pods: u32,
    /// The longest wait, seconds.
    pub longest_seconds: u64,
}

/// One piece of tuning advice.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TuningAdvice {
    /// What to change: `deviceMemoryScaling`, `deviceSplitCount`,
    /// `gpucores` (the pods' compute limits, or `gpuCorePolicy`), or
    /// `nodes` (more GPU nodes).
    pub setting: String,
    /// The current value, where the advice is a setting's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The advised value, where the advice is a setting's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The advice in words, with its evidence, e.g. `deviceMemoryScaling
    /// 1.0 → 1.9: p95 memory use 31 % of limits over 6h across 16 GPUs`.
    pub message: String,
}

/// Two or more configs of equal priority set one key to different values on one node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigConflict {
    /// The node.
    pub node: String,
    /// The setting, e.g. `deviceSplitCount`.
    pub field: String,
    /// The configs that set it, sorted; the first one wins.
    pub configs: Vec<String>,
}
