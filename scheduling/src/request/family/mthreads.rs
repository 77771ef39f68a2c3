//! Moore Threads GPUs: HAMi's `mthreads:` section (`pkg/device/mthreads`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::{names::mthreads::MEMORY_UNIT_MIB, v1alpha1::DeviceFamily};

use super::{Annotations, Family, Parsed, Quota};
use crate::request::mthreads;
use crate::request::types::ContainerKind;
use crate::request::vendors::MthreadsConfig;

impl Family for MthreadsConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Mthreads
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
        parsed.take(mthreads::parse(container, kind, self, annotations));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of(
            &self.resource_memory_name,
            MEMORY_UNIT_MIB,
            &self.resource_core_name,
        )]
    }
}
