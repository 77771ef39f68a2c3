//! The families whose pods name a count, memory and cores and nothing
//! else, as HAMi reads them: Hygon DCUs (HAMi's `hygon:` section,
//! `pkg/device/hygon`), Cambricon MLUs (`cambricon:`, `pkg/device/cambricon`)
//! and AMD Instinct GPUs (`amd:`, `pkg/device/amd`). Each is its
//! [`Simple`] reader; its [`Family`] follows from it.

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::simple::{self, Simple};
use crate::request::types::ContainerKind;
use crate::request::vendors::{AmdConfig, CambriconConfig, HygonConfig};

/// A configuration section read by a [`Simple`] reader.
pub(super) trait SimpleFamily: Send + Sync {
    /// The section's reader.
    fn reader(&self) -> Simple<'_>;
}

impl SimpleFamily for HygonConfig {
    fn reader(&self) -> Simple<'_> {
        Simple::hygon(self)
    }
}

impl SimpleFamily for CambriconConfig {
    fn reader(&self) -> Simple<'_> {
        Simple::cambricon(self)
    }
}

impl SimpleFamily for AmdConfig {
    fn reader(&self) -> Simple<'_> {
        Simple::amd(self)
    }
}

impl<T: SimpleFamily> Family for T {
    fn id(&self) -> DeviceFamily {
        self.reader().family
    }

    /// The count, and memory and cores where named (AMD's may be left
    /// empty).
    fn resources(&self) -> Vec<&str> {
        let reader = self.reader();
        std::iter::once(reader.count)
            .chain(
                [reader.memory, reader.cores]
                    .into_iter()
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
        parsed.take(simple::parse(container, kind, &self.reader(), annotations));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        let reader = self.reader();
        vec![Quota::of(reader.memory, reader.memory_unit, reader.cores)]
    }
}
