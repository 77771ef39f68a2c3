//! Cluster-wide request defaults (HAMi's device ConfigMap `nvidia:` section).

use serde::{Deserialize, Serialize};

use super::vendors::{
    AmdConfig, AwsNeuronConfig, CambriconConfig, EnflameConfig, HygonConfig, IluvatarConfig,
    KunlunConfig, MetaxConfig, MthreadsConfig, VnpusConfig,
};
use tessera_api::names::resources;
use tessera_api::{Error, Result};

/// Cluster-wide defaults that turn a container's resources into a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct RequestConfig {
    /// The extended resource names pods use.
    pub resources: ResourceNames,
    /// MiB per vGPU when a container names no memory; 0 means the whole device.
    pub default_memory: u64,
    /// Percent of SMs per vGPU when a container names no cores.
    pub default_cores: u32,
    /// vGPUs for a container that names memory or cores but no count.
    #[serde(rename = "defaultGPUNum")]
    pub default_gpu_num: u32,
    /// HAMi's `hygon:` section; absent: Hygon DCUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hygon: Option<HygonConfig>,
    /// HAMi's `vnpus:` section; absent: Ascend NPUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vnpus: Option<VnpusConfig>,
    /// HAMi's `mthreads:` section; absent: Moore Threads GPUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mthreads: Option<MthreadsConfig>,
    /// HAMi's `cambricon:` section; absent: Cambricon MLUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cambricon: Option<CambriconConfig>,
    /// HAMi's `enflame:` section; absent: Enflame GCUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enflame: Option<EnflameConfig>,
    /// HAMi's `metax:` section; absent: MetaX GPUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metax: Option<MetaxConfig>,
    /// HAMi's `kunlun:` section; absent: Kunlunxin XPUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kunlun: Option<KunlunConfig>,
    /// HAMi's `awsneuron:` section; absent: AWS Neuron devices are not
    /// scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub awsneuron: Option<AwsNeuronConfig>,
    /// HAMi's `amd:` section; absent: AMD GPUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amd: Option<AmdConfig>,
    /// HAMi's `vastai:` section; absent: Vastai devices are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vastai: Option<crate::request::family::vastai::config::VastaiConfig>,
    /// HAMi's `biren:` section; absent: Biren GPUs are not scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub biren: Option<crate::request::family::biren::config::BirenConfig>,
    /// HAMi's `iluvatars:` section, one entry per chip; empty: Iluvatar GPUs
    /// are not scheduled.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub iluvatars: Vec<IluvatarConfig>,
}

impl Default for RequestConfig {
    /// HAMi's defaults: whole-device memory, 0 cores, 1 vGPU.
    fn default() -> Self {
        Self {
            resources: ResourceNames::default(),
            default_memory: 0,
            default_cores: 0,
            default_gpu_num: 1,
            hygon: None,
            vnpus: None,
            iluvatars: Vec::new(),
            cambricon: None,
            mthreads: None,
            metax: None,
            enflame: None,
            amd: None,
            vastai: None,
            biren: None,
            kunlun: None,
            awsneuron: None,
        }
    }
}

impl RequestConfig {
    /// Checks the defaults make sense, naming the first setting that does not.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, rule: &str| {
            Err(Error::InvalidConfig {
                field: field.to_owned(),
                rule: rule.to_owned(),
            })
        };
        if self.default_gpu_num == 0 || self.default_gpu_num > super::types::MAX_GPUS_PER_CONTAINER
        {
            return invalid("defaultGPUNum", "must be between 1 and 64");
        }
        if self.default_cores > 100 {
            return invalid("defaultCores", "must be between 0 and 100");
        }
        if self.default_memory > super::types::MAX_MEMORY_MIB {
            return invalid(
                "defaultMemory",
                "must be at most 16777216 MiB (0 means the whole device)",
            );
        }
        super::vendors::validate(self.hygon.as_ref(), self.vnpus.as_ref(), &self.iluvatars)?;
        let all = self.resource_names();
        if all.iter().any(|n| !n.contains('/')) {
            return invalid(
                "resources",
                "every resource name must be a domain-qualified extended resource, e.g. nvidia.com/gpu",
            );
        }
        if all.iter().enumerate().any(|(i, a)| all[..i].contains(a)) {
            return invalid(
                "resources",
                "resource names must be distinct, across NVIDIA and every vendor section",
            );
        }
        Ok(())
    }

    /// Every extended resource name pods may ask for, NVIDIA's and those of
    /// every configured vendor (empty optional names left out), family by
    /// family ([`super::Family::resources`]): what the webhook matches
    /// and kube-scheduler leaves to the extender.
    pub fn resource_names(&self) -> Vec<&str> {
        self.families()
            .iter()
            .flat_map(|family| family.resources())
            .collect()
    }
}

/// The extended resource names pods use to ask for GPU slices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ResourceNames {
    /// Number of vGPUs (`nvidia.com/gpu`).
    pub count: String,
    /// MiB per vGPU (`nvidia.com/gpumem`).
    pub memory: String,
    /// Percent of device memory per vGPU (`nvidia.com/gpumem-percentage`).
    pub memory_percentage: String,
    /// Percent of SMs per vGPU (`nvidia.com/gpucores`).
    pub cores: String,
    /// Compute-limiter priority (`nvidia.com/priority`).
    pub priority: String,
}

impl Default for ResourceNames {
    fn default() -> Self {
        Self {
            count: resources::GPU.to_owned(),
            memory: resources::GPU_MEMORY.to_owned(),
            memory_percentage: resources::GPU_MEMORY_PERCENTAGE.to_owned(),
            cores: resources::GPU_CORES.to_owned(),
            priority: resources::PRIORITY.to_owned(),
        }
    }
}
