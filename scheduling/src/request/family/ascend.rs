//! Huawei Ascend NPUs: HAMi's `vnpus:` section, one entry per chip
//! (`pkg/device/ascend`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::ascend;
use crate::request::types::ContainerKind;
use crate::request::vendors::VnpusConfig;

impl Family for VnpusConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Ascend
    }

    fn resources(&self) -> Vec<&str> {
        let mut names = Vec::new();
        for chip in &self.configs {
            names.extend([chip.resource_name.as_str(), &chip.resource_memory_name]);
            if !chip.resource_core_name.is_empty() {
                names.push(&chip.resource_core_name);
            }
        }
        names
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        for chip in &self.configs {
            parsed.take(ascend::parse(container, kind, chip, annotations));
        }
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        self.configs
            .iter()
            .map(|chip| {
                Quota::of(
                    &chip.resource_memory_name,
                    u64::from(chip.memory_factor.max(1)),
                    &chip.resource_core_name,
                )
                .for_type(&chip.common_word)
            })
            .collect()
    }
}
