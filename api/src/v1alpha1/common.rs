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

/// Which accelerator family a device belongs to: NVIDIA GPUs served by
/// Tessera's node agent, or another vendor's devices served by that vendor's
/// own device plugin (as HAMi uses it) and scheduled by Tessera. Values are
/// lowercase; each vendor's pod API is HAMi's (docs/vendors.md).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DeviceFamily {
    /// NVIDIA GPUs (`nvidia.com/gpu`), served by Tessera's node agent.
    #[default]
    Nvidia,
    /// Hygon DCUs (`hygon.com/dcunum`), served by HAMi's dcu-vgpu-device-plugin.
    Hygon,
    /// Huawei Ascend NPUs (`huawei.com/Ascend910B4` and the other chips),
    /// served by HAMi's ascend-device-plugin.
    Ascend,
    /// Iluvatar GPUs (`iluvatar.ai/<chip>-vgpu`), served by Iluvatar's
    /// gpu-manager device plugin.
    Iluvatar,
    /// Cambricon MLUs (`cambricon.com/vmlu`), served by Cambricon's device
    /// plugin in dynamic-smlu mode.
    Cambricon,
    /// Moore Threads GPUs (`mthreads.com/vgpu`), served by Moore Threads'
    /// device plugin.
    Mthreads,
    /// MetaX GPUs, whole (`metax-tech.com/gpu`, model `Metax-GPU`) or shared
    /// (`metax-tech.com/sgpu`, model `Metax-SGPU`), served by MetaX's plugins.
    Metax,
    /// Enflame GCUs (`enflame.com/gcu`), served by Enflame's device plugin.
    Enflame,
    /// Kunlunxin XPUs, whole (`kunlunxin.com/xpu`, model `kunlun`) or
    /// shared (`kunlunxin.com/vxpu`, model `XPU`), served by Kunlunxin's
    /// plugins.
    Kunlunxin,
    /// AWS Inferentia and Trainium devices (`aws.amazon.com/neuron`,
    /// `aws.amazon.com/neuroncore`), served by AWS's Neuron device plugin;
    /// cores count NeuronCores.
    AwsNeuron,
    /// AMD Instinct GPUs (`amd.com/gpu`), served by HAMi's AMD device
    /// plugin; cores count compute units.
    Amd,
    /// Vastai accelerators (`vastaitech.com/va`), whole cards or, when the
    /// plugin registers them die by die, dies grouped by card.
    Vastai,
    /// Biren GPUs (`birentech.com/gpu`), whole cards, served by HAMi's
    /// biren-device-plugin.
    Biren,
}

impl DeviceFamily {
    /// Whether a device's cores count its compute units (AMD: a request's
    /// percent becomes ⌊percent × CUs / 100⌋ of them, at least 1), rather
    /// than percent (or, for Moore Threads, sixteenths) of the device.
    pub fn cores_are_units(self) -> bool {
        self == Self::Amd
    }

    /// Whether a device's cores are handed out by index (AWS NeuronCores:
    /// the plugin is told which cores, so a slice records them).
    pub fn cores_by_index(self) -> bool {
        self == Self::AwsNeuron
    }

    /// Every family, in the order documents list them.
    pub const ALL: [Self; 13] = [
        Self::Nvidia,
        Self::Hygon,
        Self::Ascend,
        Self::Iluvatar,
        Self::Cambricon,
        Self::Mthreads,
        Self::Metax,
        Self::Enflame,
        Self::Kunlunxin,
        Self::AwsNeuron,
        Self::Amd,
        Self::Vastai,
        Self::Biren,
    ];

    /// The value as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nvidia => "nvidia",
            Self::Hygon => "hygon",
            Self::Ascend => "ascend",
            Self::Iluvatar => "iluvatar",
            Self::Cambricon => "cambricon",
            Self::Mthreads => "mthreads",
            Self::Metax => "metax",
            Self::Enflame => "enflame",
            Self::Kunlunxin => "kunlunxin",
            Self::AwsNeuron => "awsneuron",
            Self::Amd => "amd",
            Self::Vastai => "vastai",
            Self::Biren => "biren",
        }
    }

    /// Whether this is the default family (stored objects that name none).
    pub fn is_nvidia(&self) -> bool {
        *self == Self::Nvidia
    }
}

impl std::fmt::Display for DeviceFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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

/// MetaX's app class (`metax-tech.com/sgpu-app-class`): online and offline
/// pods share GPUs only with each other, and an online pod's GPU takes no
/// new offline pod (MetaX's driver suspends offline work while online work
/// runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AppClass {
    /// Latency-sensitive work: charged no cores, put on the GPU with the
    /// fewest other online pods.
    Online,
    /// Batch work that yields to online pods.
    Offline,
}

/// MetaX's sGPU QoS policy (`metax-tech.com/sgpu-qos-policy`), which the
/// plugin sets per GPU: every shared sGPU of a GPU runs under one policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum QosPolicy {
    /// Takes idle compute; no guarantee.
    BestEffort,
    /// Exactly its share.
    FixedShare,
    /// Its share, and idle compute above it.
    BurstShare,
}

impl QosPolicy {
    /// Every policy, in the order MetaX lists them.
    pub const ALL: [Self; 3] = [Self::BestEffort, Self::FixedShare, Self::BurstShare];

    /// The annotation's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BestEffort => "best-effort",
            Self::FixedShare => "fixed-share",
            Self::BurstShare => "burst-share",
        }
    }

    /// The policy an annotation value names.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == value)
    }
}

/// How a MetaX sGPU slice shares its GPU: the pod's app class and QoS
/// policy, which decide who else the GPU may take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sharing {
    /// The pod's app class; absent: neither online nor offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_class: Option<AppClass>,
    /// The QoS policy the pod asked for; absent for online pods, and for
    /// pods that name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_policy: Option<QosPolicy>,
}

impl Sharing {
    /// Whether the pod is of the online class.
    pub fn is_online(self) -> bool {
        self.app_class == Some(AppClass::Online)
    }
}
