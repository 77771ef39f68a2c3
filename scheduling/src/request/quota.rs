//! Which ResourceQuota names a container's slices count against (HAMi's
//! device quota, `pkg/device/quota.go`): each family's memory and core
//! resource names, as `limits.<name>` keys of a namespace's ResourceQuotas.
//!
//! A slice's memory counts in MiB; a quota's limit is in the resource's own
//! unit, so it is compared as `limit × unit` MiB (HAMi's `memoryFactor`).
//! Cores count as the slices hold them (percent of a device; AMD compute
//! units, Moore Threads sixteenths, NeuronCores, as HAMi counts them).

use super::config::RequestConfig;
use super::types::{ContainerRequest, QuotaNames};

/// The prefix of the ResourceQuota keys that limit device resources.
pub const LIMITS_PREFIX: &str = "limits.";

/// What a device resource name limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaResource {
    /// Device memory; MiB per unit of the resource.
    Memory {
        /// MiB per unit.
        unit_mib: u64,
    },
    /// Device cores.
    Cores,
}

impl QuotaResource {
    /// What one unit of the resource is in a charge's unit: MiB per unit
    /// for memory, 1 for cores.
    pub fn unit(self) -> u64 {
        match self {
            Self::Memory { unit_mib } => unit_mib,
            Self::Cores => 1,
        }
    }
}

impl RequestConfig {
    /// The quota names `container`'s slices count against; none for whole
    /// devices of vendors whose count resource is apart from their shared
    /// one (MetaX GPUs, Kunlunxin XPUs), Enflame GCUs and AWS Neuron
    /// devices asked for by count.
    pub fn quota_names(&self, container: &ContainerRequest) -> QuotaNames<'_> {
        let device_type = container
            .vendor
            .as_ref()
            .and_then(|v| v.device_type.as_deref());
        let families = self.families();
        let Some(family) = families.iter().find(|f| f.id() == container.family) else {
            return QuotaNames::default();
        };
        if !family.counts_quota(container) {
            return QuotaNames::default();
        }
        // Ascend is one family for all its chips: each chip's names are
        // for its device type. Iluvatar is one family per chip.
        families
            .iter()
            .filter(|f| f.id() == container.family)
            .flat_map(|f| f.quota())
            .find(|q| q.device_type.is_none_or(|t| Some(t) == device_type))
            .map(|q| q.names)
            .unwrap_or_default()
    }

    /// What the device resource `name` limits, when a family Tessera
    /// schedules has it as its memory or core resource.
    pub fn quota_resource(&self, name: &str) -> Option<QuotaResource> {
        let families = self.families();
        let quotas: Vec<_> = families.iter().flat_map(|f| f.quota()).collect();
        quotas.into_iter().find_map(|q| match q.names {
            QuotaNames {
                memory: Some((memory, unit_mib)),
                ..
            } if memory == name => Some(QuotaResource::Memory { unit_mib }),
            QuotaNames {
                cores: Some(cores), ..
            } if cores == name => Some(QuotaResource::Cores),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{fixtures::vendor_config, pod::parse_pod};
    use super::*;

    fn names_of(limits: serde_json::Value) -> Vec<QuotaNames<'static>> {
        let config: &'static RequestConfig = Box::leak(Box::new(vendor_config()));
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }))
        .unwrap();
        let request = parse_pod(&pod, config).unwrap().unwrap();
        request
            .containers
            .iter()
            .map(|c| config.quota_names(c))
            .collect()
    }

    #[test]
    fn each_family_counts_against_its_own_names() {
        assert_eq!(
            names_of(serde_json::json!({"nvidia.com/gpu": "1"})),
            [QuotaNames {
                memory: Some(("nvidia.com/gpumem", 1)),
                cores: Some("nvidia.com/gpucores")
            }]
        );
        assert_eq!(
            names_of(serde_json::json!({"hygon.com/dcunum": "1"})),
            [QuotaNames {
                memory: Some(("hygon.com/dcumem", 1)),
                cores: Some("hygon.com/dcucores")
            }]
        );
        assert_eq!(
            names_of(serde_json::json!({"cambricon.com/vmlu": "1"}))[0].memory,
            Some(("cambricon.com/mlu.smlu.vmemory", 256))
        );
        assert_eq!(
            names_of(serde_json::json!({"kunlunxin.com/xpu": "1"})),
            [QuotaNames::default()],
            "whole XPUs are not quota'd"
        );
        assert_eq!(
            names_of(serde_json::json!({"kunlunxin.com/vxpu": "1"}))[0].memory,
            Some(("kunlunxin.com/vxpu-memory", 1))
        );
        assert_eq!(
            names_of(serde_json::json!({"metax-tech.com/sgpu": "1"}))[0],
            QuotaNames {
                memory: Some(("metax-tech.com/vmemory", 1024)),
                cores: Some("metax-tech.com/vcore")
            }
        );
    }

    #[test]
    fn only_memory_and_core_names_are_quota_resources() {
        let config = vendor_config();
        assert_eq!(
            config.quota_resource("nvidia.com/gpumem"),
            Some(QuotaResource::Memory { unit_mib: 1 })
        );
        assert_eq!(
            config.quota_resource("nvidia.com/gpucores"),
            Some(QuotaResource::Cores)
        );
        assert_eq!(
            config.quota_resource("mthreads.com/sgpu-memory"),
            Some(QuotaResource::Memory { unit_mib: 512 })
        );
        for other in ["nvidia.com/gpu", "nvidia.com/gpumem-percentage", "cpu", ""] {
            assert_eq!(config.quota_resource(other), None, "{other}");
        }
    }
}
