//! MIG (Multi-Instance GPU) shapes shared by GpuNode and VgpuAllocation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where an instance sits on its GPU, in memory-slice units (what
/// `nvidia-smi mig -lgipp` prints as `{start}:size`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigPlacement {
    /// The first memory slice the instance uses.
    #[schemars(range(max = 7))]
    pub start: u32,
    /// How many memory slices it uses.
    #[schemars(range(min = 1, max = 8))]
    pub size: u32,
}

/// What a GPU can be cut into: its MIG profiles and their placement rules.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigLayout {
    /// Memory slices on the GPU (8 on A100, H100 and H200).
    #[schemars(range(min = 1, max = 8))]
    pub memory_slices: u32,
    /// Compute slices on the GPU (7 on A100, H100 and H200).
    #[schemars(range(min = 1, max = 8))]
    pub compute_slices: u32,
    /// The GPU instance profiles, as NVML lists them.
    #[schemars(length(max = 32))]
    pub profiles: Vec<MigProfile>,
}

/// One GPU instance profile, e.g. `2g.20gb`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigProfile {
    /// The profile's name without the `MIG ` prefix, e.g. `2g.20gb`.
    #[schemars(length(min = 1, max = 32))]
    pub name: String,
    /// NVML's GPU instance profile ID (e.g. 14 for `2g.20gb`).
    pub id: u32,
    /// Device memory of one instance, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Compute slices one instance takes.
    pub compute_slices: u32,
    /// Memory slices one instance takes (the placement size).
    pub memory_slices: u32,
    /// At most this many instances of the profile at once.
    pub max_instances: u32,
    /// The memory slices an instance of this profile may start at.
    #[schemars(length(max = 8))]
    pub placements: Vec<u32>,
    /// Whether the profile carries media extensions (`+me`); Tessera never
    /// picks such a profile for a memory request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub media: bool,
}

/// One MIG instance that exists on a GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// The MIG profile, e.g. `1g.10gb`.
    pub profile: String,
    /// The instance's UUID, e.g. `MIG-...`.
    pub uuid: String,
    /// The instance's memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Where the instance sits on the GPU.
    pub placement: MigPlacement,
    /// The live allocation (`namespace/name`) that holds the instance: the
    /// one it was created for (dynamic MIG), or the record of the pod the
    /// kubelet handed it to (static MIG); absent for an instance no live
    /// allocation holds (free, or made by someone else: the scheduler keeps
    /// clear of it until it is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// The MIG instance a dynamic-MIG slice is served by.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigSlice {
    /// The profile the scheduler chose, e.g. `2g.20gb`.
    #[schemars(length(min = 1, max = 32))]
    pub profile: String,
    /// Where on the GPU the node agent creates the instance.
    pub placement: MigPlacement,
}

/// A MIG instance the node agent created for one container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServedMigInstance {
    /// The container it was handed to.
    pub container: String,
    /// The parent GPU's UUID.
    pub gpu: String,
    /// The instance's UUID (`MIG-...`), what the container sees.
    pub uuid: String,
}
