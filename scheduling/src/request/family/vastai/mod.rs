//! Vastai accelerators: HAMi's `vastai:` section (`pkg/device/vastai`).
//!
//! - `vastaitech.com/va` is a number of devices; a device takes as many
//!   containers as the `count` the plugin registers, and neither memory
//!   nor cores are asked (HAMi's `Fit` checks only the count, health, the
//!   UUID filters and the `mutex` policy).
//! - The plugin registers whole cards, or (`custominfo.DeviceStrategy:
//!   die`) each card's dies with the card they sit on (`custominfo.AIC`),
//!   which the vendor view reads as the dies' network. Dies of a
//!   multi-device container come from as few cards as possible, nodes are
//!   scored by how few cards a pod's dies span (HAMi's
//!   `computeBestCombination` and `ScoreNode`), and under `mutex` a card
//!   with any die in use is busy as a whole.
//! - `vastaitech.com/use-gpuuuid` / `nouse-gpuuuid` filter by device id.
//! - Bind writes `hami.io/Vastai-devices-to-allocate` and the Node's
//!   mutex lock.

pub(crate) mod config;
#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::Container;
use tessera_api::{
    names::vastai::{
        DEVICE_TYPE, HANDOFF_WORD, HANDSHAKE, NOUSE_TYPE, NOUSE_UUID, REGISTER, USE_TYPE, USE_UUID,
    },
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, Wording};
use crate::request::whole;
use config::VastaiConfig;

impl Family for VastaiConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Vastai
    }

    fn resources(&self) -> Vec<&str> {
        vec![&self.resource_count_name]
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        let read = whole::counted(
            container,
            kind,
            &self.resource_count_name,
            DeviceFamily::Vastai,
            (annotations, [USE_UUID, NOUSE_UUID]),
            Wording::new(
                "Vastai device",
                [USE_TYPE, NOUSE_TYPE],
                [USE_UUID, NOUSE_UUID],
            ),
        );
        parsed.take(read.map(|request| {
            request.map(|mut request| {
                if let Some(vendor) = request.vendor.as_mut() {
                    vendor.by_network = true;
                    vendor.mutex_by_network = true;
                }
                request
            })
        }));
    }

    /// None: devices are counted, not measured.
    fn quota(&self) -> Vec<Quota<'_>> {
        Vec::new()
    }

    /// HAMi's JSON register with its handshake, dies grouped by card
    /// (`Source::dies_by_card`); each
    /// device counts 100 cores, as HAMi's `GetNodeDevices` sets them for
    /// scoring.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Vastai,
                &self.resource_count_name,
                SourceKind::Json,
            )
            .register(REGISTER)
            .handshake(HANDSHAKE)
            .cores(100)
            .dies_by_card(),
        ]
    }

    /// HAMi's two `Vastai` lists, each device written as HAMi's `Fit`
    /// leaves it (type `Vastai`, no memory, no cores), and the Node's mutex
    /// lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let mine = |d: &DeviceSlice| self.claims(d);
        out.lists(HANDOFF_WORD, binding.encode_counted(mine, DEVICE_TYPE));
        out.mutex_lock(binding);
    }
}
