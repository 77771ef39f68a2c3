//! AMD Instinct GPUs: HAMi's `amd:` section (`pkg/device/amd`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::simple::{self, Simple};
use crate::request::types::ContainerKind;
use crate::request::vendors::AmdConfig;

impl Family for AmdConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Amd
    }

    fn resources(&self) -> Vec<&str> {
        std::iter::once(self.resource_count_name.as_str())
            .chain(
                [&self.resource_memory_name, &self.resource_core_name]
                    .into_iter()
                    .map(String::as_str)
                    .filter(|n| !n.is_empty()),
            )
            .collect()
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(simple::parse(
            container,
            kind,
            &Simple::amd(self),
            annotations,
        ));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of(
            &self.resource_memory_name,
            1,
            &self.resource_core_name,
        )]
    }
}
