//! Enflame GCUs, whole and as DRS partitions: HAMi's `enflame:` section
//! (`pkg/device/enflame`).

pub(super) mod read;

use k8s_openapi::api::core::v1::Container;
use std::collections::BTreeMap;

use serde::Serialize;
use tessera_api::{
    names::enflame::{
        ASSIGNED, ASSIGNED_CONTAINERS, ASSIGNED_ID, ASSIGNED_INDEX, ASSIGNED_MINOR, ASSIGNED_TIME,
        DRS_ALLOCATED, DRS_CAPACITY, DRS_TYPE, GCU_MEMORY, GCU_TYPE, REQUEST_SIZE,
    },
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::ContainerKind;
use crate::request::vendors::EnflameConfig;

/// One container's DRS partition as Enflame's plugin reads it from
/// `assigned-containers` (HAMi `assignedContainerInfo`, Go's omitempty
/// kept).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AssignedContainer<'a> {
    allocated: bool,
    request: u32,
    #[serde(rename = "profileID", skip_serializing_if = "str::is_empty")]
    profile_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    profile_name: &'a str,
}

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
        parsed.take(read::parse(container, kind, self));
        parsed.take(read::parse_drs(container, kind, self));
    }

    /// None: HAMi has no device quota for Enflame.
    /// DRS partitions from Enflame's capacity annotation
    /// (`enflame.com/gcu-drs-capacity`, no handshake); whole GCUs from the
    /// count resource alone (`<node>-GCU-<i>`, HAMi's placeholder memory
    /// of 100).
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Enflame,
                self.drs_name(),
                SourceKind::EnflameDrs,
            )
            .register(DRS_CAPACITY)
            .device_type(DRS_TYPE),
            Source::new(
                DeviceFamily::Enflame,
                &self.resource_name_gcu,
                SourceKind::Cards {
                    memory_mib: GCU_MEMORY,
                    infix: "GCU",
                },
            )
            .device_type(GCU_TYPE),
        ]
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        Vec::new()
    }
    /// Whole GCUs: HAMi's two `enflame-gcu` lists. DRS partitions: HAMi's
    /// `enflame-vgpu-devices-allocated` list, the assigned flag and time,
    /// and what Enflame's plugin reads of each container's partition
    /// (HAMi's enflame `PatchAnnotations`): `assigned-containers`, per
    /// container its profile's slices, id and name, and for the first such
    /// container its GCU's index, id, minor and slices. No lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let gcu = |d: &DeviceSlice| d.family == DeviceFamily::Enflame && d.model != DRS_TYPE;
        let drs = |d: &DeviceSlice| d.family == DeviceFamily::Enflame && d.model == DRS_TYPE;
        if binding.any(gcu) {
            out.lists(
                "enflame-gcu",
                binding.encode(gcu, |_| GCU_TYPE, |d| d.cores),
            );
        }
        if !binding.any(drs) {
            return;
        }
        out.pod(
            DRS_ALLOCATED,
            binding.encode(drs, |_| DRS_TYPE, |d| d.cores),
        );
        out.pod(ASSIGNED, "false");
        out.pod(ASSIGNED_TIME, binding.nanoseconds());
        let mut assigned = BTreeMap::new();
        for (name, slices) in binding.per_container(drs) {
            let Some(d) = slices.first() else {
                continue;
            };
            let profile_name = d.template.as_deref().unwrap_or_default();
            let size = read::drs_profile(profile_name).map_or(1, |(s, _)| s);
            let device = binding.device(&d.uuid);
            if !out.pod.contains_key(ASSIGNED_INDEX) {
                out.pod(ASSIGNED_INDEX, d.index.to_string());
                out.pod(ASSIGNED_ID, d.index.to_string());
                if let Some(minor) = device.and_then(|g| g.minor) {
                    out.pod(ASSIGNED_MINOR, minor);
                }
                out.pod(REQUEST_SIZE, size.to_string());
            }
            let profile_id = device
                .and_then(|g| g.profiles.iter().find(|(name, _)| *name == profile_name))
                .map(|(_, id)| *id)
                .unwrap_or_default();
            assigned.insert(
                name,
                AssignedContainer {
                    allocated: false,
                    request: size,
                    profile_id,
                    profile_name,
                },
            );
        }
        out.pod(
            ASSIGNED_CONTAINERS,
            serde_json::to_string(&assigned).unwrap_or_else(|_| "{}".into()),
        );
    }
}
