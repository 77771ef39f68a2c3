//! Enumerations shared by several resources.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a GPU is shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OperatingMode {
    /// Slices enforced by the interposer (HAMi-core semantics).
    #[default]
    #[serde(rename = "hami-core")]
    HamiCore,
    /// NVIDIA Multi-Instance GPU partitions.
    #[serde(rename = "mig")]
    Mig,
    /// NVIDIA Multi-Process Service.
    #[serde(rename = "mps")]
    Mps,
}

impl OperatingMode {
    /// The value as written in manifests and annotations.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HamiCore => "hami-core",
            Self::Mig => "mig",
            Self::Mps => "mps",
        }
    }
}

/// How pods reach a node's GPUs. A node serves through one door at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FrontDoor {
    /// HAMi's pod API: `nvidia.com/gpu` and friends, placed by Tessera's
    /// scheduler extender and served by the kubelet device plugin.
    #[default]
    #[serde(rename = "devicePlugin")]
    DevicePlugin,
    /// Dynamic Resource Allocation: a ResourceSlice of shareable GPUs, claims
    /// allocated by kube-scheduler and prepared by the agent's DRA plugin.
    #[serde(rename = "dra")]
    Dra,
}

impl FrontDoor {
    /// The value as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DevicePlugin => "devicePlugin",
            Self::Dra => "dra",
        }
    }
}

/// Who owns a MIG-mode GPU's instances and how they are offered, as in
/// NVIDIA's device plugin (`single`, `mixed`) plus Tessera's dynamic MIG.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// Dynamic MIG: Tessera creates an instance of the smallest fitting
    /// profile for each container and destroys it when the pod goes.
    #[default]
    None,
    /// Static MIG: the operator's instances, all of one profile, are offered
    /// as whole `nvidia.com/gpu` devices.
    Single,
    /// Static MIG: the operator's instances are offered as
    /// `nvidia.com/mig-<profile>` resources, one per profile.
    Mixed,
}

impl MigStrategy {
    /// The value as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Single => "single",
            Self::Mixed => "mixed",
        }
    }
}

/// When the compute limit applies (container env `GPU_CORE_UTILIZATION_POLICY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CorePolicy {
    /// The limit applies while the GPU is shared with another container.
    #[default]
    Default,
    /// The limit always applies.
    Force,
    /// The limit never applies.
    Disable,
}

/// How candidates are ranked: nodes by the node policy, GPUs by the GPU policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// Prefer the fullest candidate, keeping others free for large requests.
    Binpack,
    /// Prefer the emptiest candidate, spreading load.
    Spread,
}

impl SchedulingPolicy {
    /// The value as written in annotations.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
        }
    }
}

/// Health of one GPU as reported by the node agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DeviceHealth {
    /// The GPU can take work.
    #[default]
    Healthy,
    /// The GPU reported a fatal error (e.g. an XID event) and takes no new work.
    Unhealthy,
}
