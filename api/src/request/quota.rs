//! Which ResourceQuota names a container's slices count against (HAMi's
//! device quota, `pkg/device/quota.go`): each family's memory and core
//! resource names, as `limits.<name>` keys of a namespace's ResourceQuotas.
//!
//! A slice's memory counts in MiB; a quota's limit is in the resource's own
//! unit, so it is compared as `limit × unit` MiB (HAMi's `memoryFactor`).
//! Cores count as the slices hold them (percent of a device; AMD compute
//! units, Moore Threads sixteenths, NeuronCores, as HAMi counts them).

use super::config::RequestConfig;
use super::types::ContainerRequest;
use crate::names::{cambricon, iluvatar, metax, mthreads};
use crate::v1alpha1::DeviceFamily;

/// The prefix of the ResourceQuota keys that limit device resources.
pub const LIMITS_PREFIX: &str = "limits.";

/// The quota names a container's slices count against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaNames<'a> {
    /// The memory resource, and MiB per unit of it.
    pub memory: Option<(&'a str, u64)>,
    /// The core resource.
    pub cores: Option<&'a str>,
}

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

/// One family's quota names, and which of its requests count.
struct Managed<'a> {
    family: DeviceFamily,
    /// Only requests of this device type count (MetaX sGPUs, an Ascend or
    /// Iluvatar chip); `None`: every request of the family.
    device_type: Option<&'a str>,
    names: QuotaNames<'a>,
}

fn name(name: &str) -> Option<&str> {
    (!name.is_empty()).then_some(name)
}

/// Every request of `family` counts against these names (empty: none).
fn simple<'a>(family: DeviceFamily, memory: &'a str, unit: u64, cores: &'a str) -> Managed<'a> {
    Managed {
        family,
        device_type: None,
        names: QuotaNames {
            memory: name(memory).map(|m| (m, unit)),
            cores: name(cores),
        },
    }
}

impl RequestConfig {
    fn managed(&self) -> Vec<Managed<'_>> {
        let mut all = vec![Managed {
            family: DeviceFamily::Nvidia,
            device_type: None,
            names: QuotaNames {
                memory: Some((&self.resources.memory, 1)),
                cores: Some(&self.resources.cores),
            },
        }];
        if let Some(c) = &self.hygon {
            let unit = u64::from(c.memory_factor.max(1));
            all.push(simple(
                DeviceFamily::Hygon,
                &c.resource_memory_name,
                unit,
                &c.resource_core_name,
            ));
        }
        if let Some(c) = &self.cambricon {
            all.push(simple(
                DeviceFamily::Cambricon,
                &c.resource_memory_name,
                cambricon::MEMORY_UNIT_MIB,
                &c.resource_core_name,
            ));
        }
        if let Some(c) = &self.mthreads {
            all.push(simple(
                DeviceFamily::Mthreads,
                &c.resource_memory_name,
                mthreads::MEMORY_UNIT_MIB,
                &c.resource_core_name,
            ));
        }
        if let Some(c) = &self.amd {
            all.push(simple(
                DeviceFamily::Amd,
                &c.resource_memory_name,
                1,
                &c.resource_core_name,
            ));
        }
        if let Some(c) = &self.kunlun {
            all.push(simple(
                DeviceFamily::Kunlunxin,
                &c.resource_vmemory_name,
                1,
                "",
            ));
        }
        if let Some(c) = &self.awsneuron {
            all.push(simple(
                DeviceFamily::AwsNeuron,
                "",
                1,
                &c.resource_core_name,
            ));
        }
        if let Some(c) = &self.metax {
            all.push(Managed {
                device_type: Some(metax::SGPU_TYPE),
                ..simple(
                    DeviceFamily::Metax,
                    &c.resource_vmemory_name,
                    metax::VMEMORY_UNIT_MIB,
                    &c.resource_vcore_name,
                )
            });
        }
        for chip in self.vnpus.iter().flat_map(|v| &v.configs) {
            all.push(Managed {
                device_type: Some(&chip.common_word),
                ..simple(
                    DeviceFamily::Ascend,
                    &chip.resource_memory_name,
                    u64::from(chip.memory_factor.max(1)),
                    &chip.resource_core_name,
                )
            });
        }
        for chip in &self.iluvatars {
            all.push(Managed {
                device_type: Some(&chip.common_word),
                ..simple(
                    DeviceFamily::Iluvatar,
                    &chip.resource_memory_name,
                    iluvatar::MEMORY_UNIT_MIB,
                    &chip.resource_core_name,
                )
            });
        }
        all
    }

    /// The quota names `container`'s slices count against; none for whole
    /// devices of vendors whose count resource is apart from their shared
    /// one (MetaX GPUs, Kunlunxin XPUs), Enflame GCUs and AWS Neuron
    /// devices asked for by count.
    pub fn quota_names(&self, container: &ContainerRequest) -> QuotaNames<'_> {
        let vendor = container.vendor.as_ref();
        let device_type = vendor.and_then(|v| v.device_type.as_deref());
        let counted = match container.family {
            DeviceFamily::Kunlunxin => vendor.is_some_and(|v| v.same_size),
            DeviceFamily::AwsNeuron => vendor.is_some_and(|v| v.by_core_index),
            _ => true,
        };
        if !counted {
            return QuotaNames::default();
        }
        self.managed()
            .into_iter()
            .find(|m| {
                m.family == container.family && m.device_type.is_none_or(|t| Some(t) == device_type)
            })
            .map(|m| m.names)
            .unwrap_or_default()
    }

    /// What the device resource `name` limits, when a family Tessera
    /// schedules has it as its memory or core resource.
    pub fn quota_resource(&self, name: &str) -> Option<QuotaResource> {
        self.managed().into_iter().find_map(|m| match m.names {
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
