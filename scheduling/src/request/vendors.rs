//! The vendor sections of HAMi's device configuration (ConfigMap
//! `hami-scheduler-device`, file `device-config.yaml`), read as HAMi writes
//! them: a HAMi user copies the `hygon:` and `vnpus:` sections into Tessera's
//! controller configuration unchanged (docs/vendors.md).
//!
//! A section that is absent turns its family off: the webhook and the
//! extender then leave pods asking for those resources alone.

use serde::{Deserialize, Serialize};

use tessera_api::{Error, Result};

/// HAMi's `hygon:` section: Hygon DCUs, served by HAMi's
/// `dcu-vgpu-device-plugin`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct HygonConfig {
    /// Number of DCUs (`hygon.com/dcunum`).
    pub resource_count_name: String,
    /// MiB per DCU (`hygon.com/dcumem`).
    pub resource_memory_name: String,
    /// Percent of a DCU's compute units (`hygon.com/dcucores`; 100 when absent).
    pub resource_core_name: String,
    /// The memory resource counts in units of this many MiB (0 and 1: MiB).
    pub memory_factor: u32,
}

impl Default for HygonConfig {
    /// HAMi's defaults (`--dcu-name`, `--dcu-memory`, `--dcu-cores`).
    fn default() -> Self {
        Self {
            resource_count_name: "hygon.com/dcunum".into(),
            resource_memory_name: "hygon.com/dcumem".into(),
            resource_core_name: "hygon.com/dcucores".into(),
            memory_factor: 1,
        }
    }
}

/// HAMi's `cambricon:` section: Cambricon MLUs, served by Cambricon's
/// device plugin in dynamic-smlu mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CambriconConfig {
    /// Number of MLUs (`cambricon.com/vmlu`).
    pub resource_count_name: String,
    /// Memory per MLU in units of 256 MiB (`cambricon.com/mlu.smlu.vmemory`);
    /// the Node's allocatable of it is its MLUs' memory.
    pub resource_memory_name: String,
    /// Percent of an MLU's cores (`cambricon.com/mlu.smlu.vcore`; 100 when
    /// absent); the Node's allocatable of it is 100 per MLU.
    pub resource_core_name: String,
}

impl Default for CambriconConfig {
    /// HAMi's chart defaults (`mluResourceName`, `mluResourceMem`, `mluResourceCores`).
    fn default() -> Self {
        Self {
            resource_count_name: "cambricon.com/vmlu".into(),
            resource_memory_name: "cambricon.com/mlu.smlu.vmemory".into(),
            resource_core_name: "cambricon.com/mlu.smlu.vcore".into(),
        }
    }
}

/// HAMi's `mthreads:` section: Moore Threads GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MthreadsConfig {
    /// Number of GPUs (`mthreads.com/vgpu`).
    pub resource_count_name: String,
    /// Memory per GPU in units of 512 MiB (`mthreads.com/sgpu-memory`).
    pub resource_memory_name: String,
    /// Compute in sixteenths of a card (`mthreads.com/sgpu-core`); the
    /// Node's allocatable of it is 16 per card.
    pub resource_core_name: String,
}

impl Default for MthreadsConfig {
    /// HAMi's defaults (`--mthreads-name`, `--mthreads-memory`, `--mthreads-cores`).
    fn default() -> Self {
        Self {
            resource_count_name: "mthreads.com/vgpu".into(),
            resource_memory_name: "mthreads.com/sgpu-memory".into(),
            resource_core_name: "mthreads.com/sgpu-core".into(),
        }
    }
}

/// HAMi's `kunlun:` section: Kunlunxin XPUs, whole (`kunlunxin.com/xpu`,
/// Kunlunxin's device plugin, read from the Node's count) or shared
/// (`kunlunxin.com/vxpu`, the vXPU plugin's `hami.io/node-register-xpu`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct KunlunConfig {
    /// Number of whole XPUs (`kunlunxin.com/xpu`).
    pub resource_count_name: String,
    /// Number of vXPUs (`kunlunxin.com/vxpu`).
    #[serde(rename = "resourceVCountName")]
    pub resource_vcount_name: String,
    /// MiB per vXPU (`kunlunxin.com/vxpu-memory`), rounded up to 24576,
    /// 49152 or 98304.
    #[serde(rename = "resourceVMemoryName")]
    pub resource_vmemory_name: String,
}

impl Default for KunlunConfig {
    /// HAMi's defaults (`--kunlun-name`, `--kunlun-vcount`, `--kunlun-vmemory`).
    fn default() -> Self {
        Self {
            resource_count_name: "kunlunxin.com/xpu".into(),
            resource_vcount_name: "kunlunxin.com/vxpu".into(),
            resource_vmemory_name: "kunlunxin.com/vxpu-memory".into(),
        }
    }
}

/// HAMi's `awsneuron:` section: AWS Inferentia and Trainium devices,
/// served by AWS's Neuron device plugin, read from the Node's capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AwsNeuronConfig {
    /// Number of whole devices (`aws.amazon.com/neuron`).
    pub resource_count_name: String,
    /// Number of NeuronCores (`aws.amazon.com/neuroncore`).
    pub resource_core_name: String,
}

impl Default for AwsNeuronConfig {
    /// HAMi's chart defaults (`device-configmap.yaml`, `awsneuron:`).
    fn default() -> Self {
        Self {
            resource_count_name: "aws.amazon.com/neuron".into(),
            resource_core_name: "aws.amazon.com/neuroncore".into(),
        }
    }
}

/// HAMi's `amd:` section: AMD Instinct GPUs, served by HAMi's AMD device
/// plugin (`docs/develop/amd-vgpu.md`), which registers them in
/// `hami.io/node-amd-register`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AmdConfig {
    /// Number of GPUs (`amd.com/gpu`).
    pub resource_count_name: String,
    /// MiB per GPU (`amd.com/gpumem`; absent or 0: the whole GPU; empty
    /// name: not offered).
    pub resource_memory_name: String,
    /// Percent (1-100) of each GPU's compute units (`amd.com/gpucores`; 100
    /// when absent; empty name: not offered).
    pub resource_core_name: String,
}

impl Default for AmdConfig {
    /// HAMi's chart defaults (`device-configmap.yaml`, `amd:`).
    fn default() -> Self {
        Self {
            resource_count_name: "amd.com/gpu".into(),
            resource_memory_name: "amd.com/gpumem".into(),
            resource_core_name: "amd.com/gpucores".into(),
        }
    }
}

/// HAMi's `enflame:` section: Enflame GCUs, whole (`enflame.com/gcu`) or
/// cut into DRS partitions (`enflame.com/drs-gcu`, or `gcu-memory` and
/// `gcu-core`; docs/vendors.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnflameConfig {
    /// Number of whole GCUs (`enflame.com/gcu`).
    #[serde(rename = "resourceNameGCU")]
    pub resource_name_gcu: String,
    /// Number of DRS slices (`enflame.com/drs-gcu`).
    #[serde(rename = "resourceNameDRSGCU")]
    pub resource_name_drs_gcu: String,
    /// DRS memory (`enflame.com/gcu-memory`).
    #[serde(rename = "resourceNameGCUMemory")]
    pub resource_name_gcu_memory: String,
    /// DRS compute percent (`enflame.com/gcu-core`).
    #[serde(rename = "resourceNameGCUCore")]
    pub resource_name_gcu_core: String,
    /// The legacy shared-GCU count HAMi still accepts (empty: none).
    #[serde(rename = "resourceNameVGCU")]
    pub resource_name_vgcu: String,
    /// The legacy shared-GCU percentage (empty: none).
    #[serde(rename = "resourceNameVGCUPercentage")]
    pub resource_name_vgcu_percentage: String,
}

impl Default for EnflameConfig {
    /// HAMi's chart defaults.
    fn default() -> Self {
        Self {
            resource_name_gcu: "enflame.com/gcu".into(),
            resource_name_drs_gcu: "enflame.com/drs-gcu".into(),
            resource_name_gcu_memory: "enflame.com/gcu-memory".into(),
            resource_name_gcu_core: "enflame.com/gcu-core".into(),
            resource_name_vgcu: String::new(),
            resource_name_vgcu_percentage: String::new(),
        }
    }
}

impl EnflameConfig {
    /// The DRS slices' name: `resourceNameDRSGCU`, or when that is empty
    /// the legacy `resourceNameVGCU` (HAMi's `InitEnflameDevice`).
    pub fn drs_name(&self) -> &str {
        if self.resource_name_drs_gcu.is_empty() {
            &self.resource_name_vgcu
        } else {
            &self.resource_name_drs_gcu
        }
    }

    /// The DRS names: slices, memory, cores (empty ones left out).
    pub fn drs_names(&self) -> impl Iterator<Item = &str> {
        [
            self.drs_name(),
            &self.resource_name_gcu_memory,
            &self.resource_name_gcu_core,
        ]
        .into_iter()
        .filter(|n| !n.is_empty())
    }

    /// The legacy names HAMi's scheduler reads nowhere (the vGCU count
    /// when the DRS name is set, and the vGCU percentage): refused.
    pub fn unscheduled_names(&self) -> impl Iterator<Item = &str> {
        let vgcu = (self.drs_name() != self.resource_name_vgcu).then_some(&self.resource_name_vgcu);
        vgcu.into_iter()
            .chain([&self.resource_name_vgcu_percentage])
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }
}

/// HAMi's `metax:` section: MetaX GPUs, whole (`metax-tech.com/gpu`, MetaX's
/// gpu-device plugin) or shared (`metax-tech.com/sgpu`, MetaX's sgpu plugin).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MetaxConfig {
    /// Number of whole GPUs (`metax-tech.com/gpu`).
    pub resource_count_name: String,
    /// Number of sGPUs (`metax-tech.com/sgpu`).
    #[serde(rename = "resourceVCountName")]
    pub resource_vcount_name: String,
    /// Memory per sGPU: a bare number in GiB, or a quantity with a unit
    /// (`metax-tech.com/vmemory`).
    #[serde(rename = "resourceVMemoryName")]
    pub resource_vmemory_name: String,
    /// Percent of an sGPU's compute (`metax-tech.com/vcore`; 100 when absent).
    #[serde(rename = "resourceVCoreName")]
    pub resource_vcore_name: String,
    /// Whether exclusive sGPU pods prefer GPUs on one MetaLink unless their
    /// `metax-tech.com/sgpu-topology-aware` annotation says otherwise.
    pub sgpu_topology_aware: bool,
}

impl Default for MetaxConfig {
    /// HAMi's defaults (`--metax-name`, `--metax-vcount`, `--metax-vmemory`,
    /// `--metax-vcore`).
    fn default() -> Self {
        Self {
            resource_count_name: "metax-tech.com/gpu".into(),
            resource_vcount_name: "metax-tech.com/sgpu".into(),
            resource_vmemory_name: "metax-tech.com/vmemory".into(),
            resource_vcore_name: "metax-tech.com/vcore".into(),
            sgpu_topology_aware: false,
        }
    }
}

/// HAMi's `vnpus:` section: Huawei Ascend NPUs, one entry per chip, served by
/// HAMi's `ascend-device-plugin`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct VnpusConfig {
    /// Whether nodes run HAMi's `hami-vnpu-core` soft split unless their
    /// Node annotation `hami-vnpu-core` says otherwise.
    pub hami_vnpu_core: bool,
    /// One entry per Ascend chip.
    pub configs: Vec<VnpuConfig>,
}

/// One Ascend chip: its resource names, memory and vNPU templates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct VnpuConfig {
    /// The chip's name as the driver reports it (`910B4`).
    pub chip_name: String,
    /// The device type HAMi and the plugin key everything by (`Ascend910B4`):
    /// the register annotation `hami.io/node-register-<commonWord>`, the pod
    /// annotation `huawei.com/<commonWord>`, devices' `type`.
    pub common_word: String,
    /// Number of NPUs (`huawei.com/Ascend910B4`).
    pub resource_name: String,
    /// MiB per NPU (`huawei.com/Ascend910B4-memory`).
    pub resource_memory_name: String,
    /// Percent of an NPU's AI cores, only with `huawei.com/vnpu-mode:
    /// hami-core` (`huawei.com/Ascend910B4-core`).
    pub resource_core_name: String,
    /// The MiB a whole card gives a container.
    pub memory_allocatable: u64,
    /// The card's memory in MiB; a request above it fits no card.
    pub memory_capacity: u64,
    /// The memory resource counts in units of this many MiB (0 and 1: MiB).
    pub memory_factor: u32,
    /// AI cores per card (for display; HAMi does not schedule by it).
    pub ai_core: u32,
    /// AI CPUs per card (for display).
    #[serde(rename = "aiCPU")]
    pub ai_cpu: u32,
    /// The RuntimeClass the webhook gives a pod asking for this chip's NPUs
    /// that names none (empty: none), as HAMi's does.
    pub runtime_class_name: String,
    /// When set, the webhook adds an empty `ASCEND_VISIBLE_DEVICES` to every
    /// container of the pod that asks for no Ascend NPU, as HAMi's does.
    pub overwrite_env: bool,
    /// The vNPU templates, any order: a memory request rounds up to the
    /// smallest template that holds it.
    pub templates: Vec<VnpuTemplate>,
    /// Ascend 910C in a SuperPod: NPUs are allocated in module pairs.
    pub super_pod: bool,
}

/// One entry of HAMi's `iluvatars:` section: one Iluvatar chip (HAMi ≥ 2.6
/// names resources per chip, e.g. `iluvatar.ai/MR-V100-vgpu`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct IluvatarConfig {
    /// The chip's name (`MR-V100`).
    pub chip_name: String,
    /// The device type HAMi and the plugin key everything by (`MR-V100`):
    /// `hami.io/node-<commonWord>-register`, devices' `type`.
    pub common_word: String,
    /// Number of GPUs (`iluvatar.ai/MR-V100-vgpu`).
    pub resource_count_name: String,
    /// Memory per GPU in units of 256 MiB (`iluvatar.ai/MR-V100.vMem`).
    pub resource_memory_name: String,
    /// Percent of a GPU's cores (`iluvatar.ai/MR-V100.vCore`).
    pub resource_core_name: String,
}

impl IluvatarConfig {
    /// The Node annotation the plugin registers its GPUs in (CSV).
    pub fn register_annotation(&self) -> String {
        format!("hami.io/node-{}-register", self.common_word)
    }

    /// The Node annotation of the register handshake.
    pub fn handshake_annotation(&self) -> String {
        format!("hami.io/node-handshake-{}", self.common_word)
    }
}

/// One vNPU template of an Ascend chip.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct VnpuTemplate {
    /// The template's name (`vir04`, `vir05_1c_16g`).
    pub name: String,
    /// Its memory in MiB.
    pub memory: u64,
    /// Its AI cores.
    pub ai_core: u32,
    /// Its AI CPUs.
    #[serde(rename = "aiCPU")]
    pub ai_cpu: u32,
}

impl VnpuConfig {
    /// The MiB a memory request of `mib` takes on this chip, and the template
    /// it is cut as: the smallest template holding it, else the whole card
    /// (`memoryAllocatable`, no template) while it is within
    /// `memoryCapacity`; `None` when no card holds it (HAMi's `trimMemory`).
    pub fn trim_memory(&self, mib: u64) -> Option<(u64, Option<&str>)> {
        let mut templates: Vec<&VnpuTemplate> = self.templates.iter().collect();
        templates.sort_by_key(|t| t.memory);
        if let Some(t) = templates.into_iter().find(|t| mib <= t.memory) {
            return Some((t.memory, Some(t.name.as_str())));
        }
        (mib <= self.memory_capacity).then_some((self.memory_allocatable, None))
    }

    /// Whether NPUs of this chip are scheduled by network (Ascend 910s
    /// report a `NetworkID`).
    pub fn is_910(&self) -> bool {
        self.common_word.starts_with("Ascend910")
    }

    /// Whether NPUs are allocated in module pairs (Ascend 910C in a SuperPod).
    pub fn pairs(&self) -> bool {
        self.common_word == "Ascend910C" && self.super_pod
    }

    /// The Node annotation the plugin registers its NPUs in.
    pub fn register_annotation(&self) -> String {
        format!("hami.io/node-register-{}", self.common_word)
    }

    /// The Node annotation of the register handshake.
    pub fn handshake_annotation(&self) -> String {
        format!("hami.io/node-handshake-{}", self.common_word)
    }

    /// The pod annotation listing the NPUs a pod may use.
    pub fn use_uuid_annotation(&self) -> String {
        tessera_api::names::ascend::use_uuid(&self.common_word)
    }

    /// The pod annotation listing NPUs a pod must not use.
    pub fn nouse_uuid_annotation(&self) -> String {
        tessera_api::names::ascend::nouse_uuid(&self.common_word)
    }
}

/// Whether a device type is one HAMi's annotations can carry in their keys.
fn valid_word(word: &str) -> bool {
    !word.is_empty()
        && word.len() <= 63
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// Checks a vendor section, naming the first setting that is wrong.
pub(super) fn validate(
    hygon: Option<&HygonConfig>,
    vnpus: Option<&VnpusConfig>,
    iluvatars: &[IluvatarConfig],
) -> Result<()> {
    let invalid = |field: String, rule: &str| {
        Err(Error::InvalidConfig {
            field,
            rule: rule.to_owned(),
        })
    };
    if let Some(vnpus) = vnpus {
        for (i, chip) in vnpus.configs.iter().enumerate() {
            let at = |field: &str| format!("vnpus.configs[{i}].{field}");
            if !valid_word(&chip.common_word) {
                return invalid(
                    at("commonWord"),
                    "must be a non-empty device type of letters, digits and '-' (e.g. Ascend910B4)",
                );
            }
            if vnpus.configs[..i]
                .iter()
                .any(|c| c.common_word == chip.common_word)
            {
                return invalid(at("commonWord"), "each chip may be configured once");
            }
            if chip.memory_capacity == 0 || chip.memory_allocatable == 0 {
                return invalid(
                    at("memoryAllocatable"),
                    "memoryAllocatable and memoryCapacity must be positive MiB",
                );
            }
            if chip.memory_allocatable > chip.memory_capacity {
                return invalid(at("memoryAllocatable"), "must not exceed memoryCapacity");
            }
            if let Some(t) = chip
                .templates
                .iter()
                .find(|t| t.memory == 0 || t.memory > chip.memory_capacity || t.name.is_empty())
            {
                return invalid(
                    at("templates"),
                    &format!(
                        "template {:?} must have a name and 1 to memoryCapacity ({}) MiB, has {}",
                        t.name, chip.memory_capacity, t.memory
                    ),
                );
            }
        }
    }
    for (i, chip) in iluvatars.iter().enumerate() {
        let at = |field: &str| format!("iluvatars[{i}].{field}");
        if !valid_word(&chip.common_word) {
            return invalid(
                at("commonWord"),
                "must be a non-empty device type of letters, digits and '-' (e.g. MR-V100)",
            );
        }
        if iluvatars[..i]
            .iter()
            .any(|c| c.common_word == chip.common_word)
        {
            return invalid(at("commonWord"), "each chip may be configured once");
        }
        if chip.resource_count_name.is_empty() || chip.resource_memory_name.is_empty() {
            return invalid(
                at("resourceCountName"),
                "resourceCountName and resourceMemoryName must be set",
            );
        }
    }
    let _ = hygon;
    Ok(())
}
