//! Kunlunxin XPUs, whole and as vXPUs: HAMi's `kunlun:` section
//! (`pkg/device/kunlun`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::kunlun;
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::KunlunConfig;

impl Family for KunlunConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Kunlunxin
    }

    fn resources(&self) -> Vec<&str> {
        vec![
            &self.resource_count_name,
            &self.resource_vcount_name,
            &self.resource_vmemory_name,
        ]
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(kunlun::parse_xpu(container, kind, self, annotations));
        parsed.take(kunlun::parse_vxpu(container, kind, self, annotations));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of(&self.resource_vmemory_name, 1, "")]
    }

    /// Only vXPUs (cards of one slice size) count; whole XPUs do not.
    fn counts_quota(&self, request: &ContainerRequest) -> bool {
        request.vendor.as_ref().is_some_and(|v| v.same_size)
    }
}
