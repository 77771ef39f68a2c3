//! Iluvatar GPUs: HAMi's `iluvatars:` section, one family per chip
//! (`pkg/device/iluvatar`).

mod admit;
mod read;

use k8s_openapi::api::core::v1::Container;
use tessera_api::{
    names::iluvatar::MEMORY_UNIT_MIB,
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::IluvatarConfig;

impl Family for IluvatarConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Iluvatar
    }

    fn resources(&self) -> Vec<&str> {
        let mut names = vec![
            self.resource_count_name.as_str(),
            &self.resource_memory_name,
        ];
        if !self.resource_core_name.is_empty() {
            names.push(&self.resource_core_name);
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
        parsed.take(read::parse(container, kind, self, annotations));
    }

    /// The chip's CSV register (`hami.io/node-<chip>-register`), with its
    /// handshake, every GPU scheduled as the chip.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Iluvatar,
                &self.resource_count_name,
                SourceKind::Csv,
            )
            .register(self.register_annotation())
            .handshake(self.handshake_annotation())
            .device_type(&self.common_word),
        ]
    }

    /// Requests for this chip's GPUs.
    fn claims_request(&self, request: &ContainerRequest) -> bool {
        request.family == DeviceFamily::Iluvatar
            && request
                .vendor
                .as_ref()
                .and_then(|v| v.device_type.as_deref())
                == Some(self.common_word.as_str())
    }

    fn admit_container(&self, container: &mut Container, wanted: &ContainerRequest) {
        admit::container(self, container, wanted);
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![
            Quota::of(
                &self.resource_memory_name,
                MEMORY_UNIT_MIB,
                &self.resource_core_name,
            )
            .for_type(&self.common_word),
        ]
    }

    /// The GPUs of this chip.
    fn claims(&self, slice: &DeviceSlice) -> bool {
        slice.family == DeviceFamily::Iluvatar && slice.model == self.common_word
    }

    /// HAMi's two lists keyed by the chip (`MR-V100`), and the Node's
    /// mutex lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let word = self.common_word.as_str();
        out.lists(
            word,
            binding.encode(|d| self.claims(d), |_| word, |d| d.cores),
        );
        out.mutex_lock(binding);
    }
}
