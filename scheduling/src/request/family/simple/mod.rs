//! The families whose pods name a count, memory and cores and nothing
//! else, as HAMi reads them: Hygon DCUs (HAMi's `hygon:` section,
//! `pkg/device/hygon`), Cambricon MLUs (`cambricon:`, `pkg/device/cambricon`)
//! and AMD Instinct GPUs (`amd:`, `pkg/device/amd`). Each is its
//! [`Simple`] reader; its [`Family`] follows from it.

mod read;

use k8s_openapi::api::core::v1::Container;
use tessera_api::{
    names::{amd, cambricon, hygon},
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::ContainerKind;
use crate::request::vendors::{AmdConfig, CambriconConfig, HygonConfig};
use read::Simple;

/// A configuration section read by a [`Simple`] reader.
pub(super) trait SimpleFamily: Send + Sync {
    /// The section's reader.
    fn reader(&self) -> Simple<'_>;

    /// [`Family::sources`].
    fn sources(&self) -> Vec<Source>;

    /// [`Family::hand_off`] for the family's slices, which `mine` selects.
    fn hand_off(
        &self,
        binding: &Binding<'_>,
        mine: impl Fn(&DeviceSlice) -> bool + Copy,
        out: &mut Handoff,
    );
}

impl SimpleFamily for HygonConfig {
    fn reader(&self) -> Simple<'_> {
        Simple::hygon(self)
    }

    /// HAMi's CSV register (`hami.io/node-dcu-register`), with its
    /// handshake.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Hygon,
                &self.resource_count_name,
                SourceKind::Csv,
            )
            .register(hygon::REGISTER)
            .handshake(hygon::HANDSHAKE),
        ]
    }

    /// HAMi's two `dcu` lists, and the Node's mutex lock.
    fn hand_off(
        &self,
        binding: &Binding<'_>,
        mine: impl Fn(&DeviceSlice) -> bool + Copy,
        out: &mut Handoff,
    ) {
        out.lists(
            "dcu",
            binding.encode(mine, |_| hygon::DEVICE_TYPE, |d| d.cores),
        );
        out.mutex_lock(binding);
    }
}

impl SimpleFamily for CambriconConfig {
    fn reader(&self) -> Simple<'_> {
        Simple::cambricon(self)
    }

    /// Only the Node's allocatable: 100 cores per card and the cards'
    /// memory in units of 256 MiB (HAMi's `GetNodeDevices`), no handshake.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Cambricon,
                &self.resource_count_name,
                SourceKind::Allocatable {
                    cores: self.resource_core_name.clone(),
                    memory: self.resource_memory_name.clone(),
                    unit_mib: cambricon::MEMORY_UNIT_MIB,
                    per_card: 100,
                    infix: "cambricon-mlu",
                },
            )
            .device_type(cambricon::DEVICE_TYPE),
        ]
    }

    /// HAMi's two `cambricon-mlu` lists; for Cambricon's dynamic-smlu
    /// plugin the first MLU's profile (`<index>_<cores>_<memory units>`)
    /// and its assigned flags (HAMi's spelling and the plugin's); on the
    /// Node `cambricon.com/dsmlu.lock`, not the mutex lock.
    fn hand_off(
        &self,
        binding: &Binding<'_>,
        mine: impl Fn(&DeviceSlice) -> bool + Copy,
        out: &mut Handoff,
    ) {
        out.lists(
            "cambricon-mlu",
            binding.encode(mine, |_| cambricon::DEVICE_TYPE, |d| d.cores),
        );
        if let Some(d) = binding
            .per_container(mine)
            .into_iter()
            .find_map(|(_, slices)| slices.first().copied())
        {
            out.pod(
                cambricon::DSMLU_PROFILE,
                format!(
                    "{}_{}_{}",
                    d.index,
                    d.cores,
                    d.memory_mib / cambricon::MEMORY_UNIT_MIB
                ),
            );
        }
        for key in [
            cambricon::DSMLU_ASSIGNED,
            cambricon::DSMLU_ASSIGNED_BY_PLUGIN,
        ] {
            out.pod(key, "false");
        }
        out.node
            .insert(cambricon::DSMLU_LOCK.to_owned(), binding.lock_time());
    }
}

impl SimpleFamily for AmdConfig {
    fn reader(&self) -> Simple<'_> {
        Simple::amd(self)
    }

    /// HAMi's JSON register (`hami.io/node-amd-register`) without a
    /// handshake: the plugin lives while the Node advertises the count
    /// resource. Each GPU keeps its product type.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Amd,
                &self.resource_count_name,
                SourceKind::Json,
            )
            .register(amd::REGISTER),
        ]
    }

    /// HAMi's two `amd` lists, each GPU written with its product type
    /// (`AMD Instinct MI300X VF`, as HAMi's AMD `Fit` keeps it), and the
    /// Node's mutex lock.
    fn hand_off(
        &self,
        binding: &Binding<'_>,
        mine: impl Fn(&DeviceSlice) -> bool + Copy,
        out: &mut Handoff,
    ) {
        out.lists(
            amd::HANDOFF_WORD,
            binding.encode(mine, |d| d.model.clone(), |d| d.cores),
        );
        out.mutex_lock(binding);
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
        parsed.take(read::parse(container, kind, &self.reader(), annotations));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        let reader = self.reader();
        vec![Quota::of(reader.memory, reader.memory_unit, reader.cores)]
    }

    fn sources(&self) -> Vec<Source> {
        SimpleFamily::sources(self)
    }

    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let family = self.id();
        SimpleFamily::hand_off(self, binding, move |d| d.family == family, out);
    }
}
