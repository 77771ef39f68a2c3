//! Enflame GCUs, whole and as DRS partitions: HAMi's `enflame:` section
//! (`pkg/device/enflame`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::enflame;
use crate::request::types::ContainerKind;
use crate::request::vendors::EnflameConfig;

impl Family for EnflameConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Enflame
    }

    fn resources(&self) -> Vec<&str> {
        std::iter::once(self.resource_name_gcu.as_str())
            .chain(self.drs_names())
            .chain(self.unscheduled_names())
            .collect()
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        _: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(enflame::parse(container, kind, self));
        parsed.take(enflame::parse_drs(container, kind, self));
    }

    /// None: HAMi has no device quota for Enflame.
    fn quota(&self) -> Vec<Quota<'_>> {
        Vec::new()
    }
}
