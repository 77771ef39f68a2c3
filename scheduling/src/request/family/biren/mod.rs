//! Biren GPUs: HAMi's `biren:` section (`pkg/device/biren`), served by
//! Project-HAMi/biren-device-plugin.
//!
//! - `birentech.com/gpu` is a number of GPUs; a GPU takes as many
//!   containers as the `count` the plugin registers (1: a whole card) and
//!   neither memory nor cores are asked (HAMi's `Fit` checks only the
//!   count, health, the UUID filters and the `mutex` policy).
//! - `birentech.com/use-gpuuuid` / `nouse-gpuuuid` filter by GPU id.
//! - The plugin registers its GPUs as JSON in `hami.io/node-biren-register`
//!   with HAMi's handshake, finds its pod through `hami.io/mutex.lock`,
//!   and reads the GPUs from `hami.io/Biren-devices-allocated`.

pub(crate) mod config;
#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::Container;
use tessera_api::{
    names::biren::{
        DEVICE_TYPE, HANDOFF_WORD, HANDSHAKE, NOUSE_TYPE, NOUSE_UUID, REGISTER, USE_TYPE, USE_UUID,
    },
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, Wording};
use crate::request::whole;
use config::BirenConfig;

impl Family for BirenConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Biren
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
        parsed.take(whole::counted(
            container,
            kind,
            &self.resource_count_name,
            DeviceFamily::Biren,
            (annotations, [USE_UUID, NOUSE_UUID]),
            Wording::new("Biren GPU", [USE_TYPE, NOUSE_TYPE], [USE_UUID, NOUSE_UUID]),
        ));
    }

    /// None: GPUs are counted, not measured.
    fn quota(&self) -> Vec<Quota<'_>> {
        Vec::new()
    }

    /// HAMi's JSON register with its handshake; each GPU counts 100 cores,
    /// as HAMi's `GetNodeDevices` sets them for scoring.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Biren,
                &self.resource_count_name,
                SourceKind::Json,
            )
            .register(REGISTER)
            .handshake(HANDSHAKE)
            .cores(100),
        ]
    }

    /// HAMi's two `Biren` lists (the plugin reads `-devices-allocated`),
    /// each GPU written as HAMi's `Fit` leaves it (type `Biren`, no memory,
    /// no cores), and the Node's mutex lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let mine = |d: &DeviceSlice| self.claims(d);
        out.lists(HANDOFF_WORD, binding.encode_counted(mine, DEVICE_TYPE));
        out.mutex_lock(binding);
    }
}
