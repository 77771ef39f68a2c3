//! Cambricon MLUs: HAMi's `cambricon:` section (`pkg/device/cambricon`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::{names::cambricon::MEMORY_UNIT_MIB, v1alpha1::DeviceFamily};

use super::{Annotations, Family, Parsed, Quota};
use crate::request::simple::{self, Simple};
use crate::request::types::ContainerKind;
use crate::request::vendors::CambriconConfig;

impl Family for CambriconConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Cambricon
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
            &Simple::cambricon(self),
            annotations,
        ));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of(
            &self.resource_memory_name,
            MEMORY_UNIT_MIB,
            &self.resource_core_name,
        )]
    }
}
