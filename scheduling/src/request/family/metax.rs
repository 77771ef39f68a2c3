//! MetaX GPUs, whole and as sGPUs: HAMi's `metax:` section
//! (`pkg/device/metax`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::{
    names::metax::{SGPU_TYPE, VMEMORY_UNIT_MIB},
    v1alpha1::DeviceFamily,
};

use super::{Annotations, Family, Parsed, Quota};
use crate::request::metax;
use crate::request::types::ContainerKind;
use crate::request::vendors::MetaxConfig;

impl Family for MetaxConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Metax
    }

    fn resources(&self) -> Vec<&str> {
        vec![
            &self.resource_count_name,
            &self.resource_vcount_name,
            &self.resource_vmemory_name,
            &self.resource_vcore_name,
        ]
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(metax::parse_gpu(container, kind, self));
        parsed.take(metax::parse_sgpu(container, kind, self, annotations));
    }

    /// Only sGPUs count: whole GPUs have a count resource of their own.
    fn quota(&self) -> Vec<Quota<'_>> {
        vec![
            Quota::of(
                &self.resource_vmemory_name,
                VMEMORY_UNIT_MIB,
                &self.resource_vcore_name,
            )
            .for_type(SGPU_TYPE),
        ]
    }
}
