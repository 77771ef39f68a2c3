//! Huawei Ascend NPUs: HAMi's `vnpus:` section, one entry per chip
//! (`pkg/device/ascend`).

mod admit;
mod read;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;
use tessera_api::v1alpha1::{DeviceFamily, DeviceSlice};

use super::handoff::is_zero;
use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::{VnpuConfig, VnpusConfig};

/// HAMi's Ascend annotation with the time of the Filter decision.
const PREDICATE_TIME: &str = "predicate-time";

/// One Ascend NPU as `huawei.com/<chip>` lists it (Go's omitempty kept).
#[derive(Serialize)]
struct RuntimeInfo<'a> {
    #[serde(rename = "UUID")]
    uuid: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    temp: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    memory: u64,
    #[serde(skip_serializing_if = "is_zero")]
    core: u32,
}

/// Whether `slice` is an NPU of `chip`.
fn of_chip(chip: &VnpuConfig, slice: &DeviceSlice) -> bool {
    slice.family == DeviceFamily::Ascend && slice.model == chip.common_word
}

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
            parsed.take(read::parse(container, kind, chip, annotations));
        }
    }

    /// One JSON register per chip (`hami.io/node-register-<chip>`), with
    /// its handshake, every NPU scheduled as the chip.
    fn sources(&self) -> Vec<Source> {
        self.configs
            .iter()
            .map(|chip| Source {
                npu_templates: true,
                ..Source::new(DeviceFamily::Ascend, &chip.resource_name, SourceKind::Json)
                    .register(chip.register_annotation())
                    .handshake(chip.handshake_annotation())
                    .device_type(&chip.common_word)
            })
            .collect()
    }

    fn admit_container(&self, container: &mut Container, wanted: &ContainerRequest) {
        admit::container(self, container, wanted);
    }

    fn admit_pod(&self, pod: &mut Pod, wanted: &[ContainerRequest]) {
        admit::pod(self, pod, wanted, |r| self.claims_request(r));
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

    /// The NPUs of a configured chip.
    fn claims(&self, slice: &DeviceSlice) -> bool {
        self.configs.iter().any(|chip| of_chip(chip, slice))
    }

    /// Per chip, HAMi's two `<chip>` lists, `huawei.com/<chip>` (each NPU's
    /// runtime info, its template among them) and `predicate-time`; and the
    /// Node's mutex lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        for chip in &self.configs {
            let mine = |d: &DeviceSlice| of_chip(chip, d);
            if !binding.any(mine) {
                continue;
            }
            let word = chip.common_word.as_str();
            out.lists(word, binding.encode(mine, |_| word, |d| d.cores));
            let infos: Vec<RuntimeInfo<'_>> = binding
                .per_container(mine)
                .into_iter()
                .flat_map(|(_, slices)| slices)
                .map(|d| RuntimeInfo {
                    uuid: &d.uuid,
                    temp: d.template.as_deref().unwrap_or_default(),
                    memory: d.memory_mib,
                    core: d.cores,
                })
                .collect();
            out.pod(
                format!("huawei.com/{word}"),
                serde_json::to_string(&infos).unwrap_or_else(|_| "[]".into()),
            );
            out.pod(PREDICATE_TIME, binding.seconds());
        }
        out.mutex_lock(binding);
    }
}
