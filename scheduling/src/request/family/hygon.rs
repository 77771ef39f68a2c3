//! Hygon DCUs: HAMi's `hygon:` section (`pkg/device/hygon`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::simple::{self, Simple};
use crate::request::types::ContainerKind;
use crate::request::vendors::HygonConfig;

impl Family for HygonConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Hygon
    }

    fn resources(&self) -> Vec<&str> {
        vec![
            &self.resource_count_name,
            &self.resource_memory_name,
            &self.resource_core_name,
        ]
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
            &Simple::hygon(self),
            annotations,
        ));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of(
            &self.resource_memory_name,
            u64::from(self.memory_factor.max(1)),
            &self.resource_core_name,
        )]
    }
}
