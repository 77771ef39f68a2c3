//! NVIDIA GPUs: the top level of [`RequestConfig`] (HAMi's `nvidia:`
//! settings: resource names and defaults) and `nvidia.com/*` resources.

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::config::RequestConfig;
use crate::request::container;
use crate::request::types::ContainerKind;
use crate::request::types::QuotaNames;

/// NVIDIA, as the configuration's top level sets it up (the vendors'
/// sections are families of their own).
impl Family for RequestConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Nvidia
    }

    fn resources(&self) -> Vec<&str> {
        let names = &self.resources;
        vec![
            &names.count,
            &names.memory,
            &names.memory_percentage,
            &names.cores,
            &names.priority,
        ]
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        _: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(container::parse(container, kind, self));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        let names = &self.resources;
        vec![Quota {
            device_type: None,
            names: QuotaNames {
                memory: Some((&names.memory, 1)),
                cores: Some(&names.cores),
            },
        }]
    }
}
