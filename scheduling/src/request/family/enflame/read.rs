//! Enflame GCUs, as HAMi reads them (`pkg/device/enflame`).
//!
//! - `enflame.com/gcu` is a number of whole GCUs, one container per GCU
//!   (`gcu.go`).
//! - DRS partitions (`device.go`): `enflame.com/drs-gcu` slices, or
//!   `enflame.com/gcu-memory` and `enflame.com/gcu-core`; the engine picks
//!   the device's profile (`1g.6gb`, `3g.20gb`, ...).
//! - The legacy shared-GCU percentage, which HAMi's scheduler reads
//!   nowhere, is refused naming the resource.

use k8s_openapi::api::core::v1::Container;

use crate::request::container::{Field, Reader, narrow};
use crate::request::types::Wording;
use crate::request::types::{
    ContainerKind, ContainerRequest, DrsAsk, MAX_MEMORY_MIB, MemoryRequest, VendorRequest,
};
use crate::request::vendors::EnflameConfig;
use tessera_api::Violation;
use tessera_api::names::enflame::{DRS_TYPE, GCU_TYPE};
use tessera_api::names::enflame::{NOUSE_UUID, USE_UUID};
use tessera_api::v1alpha1::DeviceFamily;

/// An Enflame DRS profile name's slices and memory in GB, as HAMi reads
/// it (`parseProfile`: `3g.20gb` is 3 slices of 20 GB, case and spaces
/// ignored); `None` unless both are whole numbers above 0 (HAMi skips
/// such profiles), or beyond what a device can have.
pub fn drs_profile(name: &str) -> Option<(u32, u32)> {
    let normalized = name.trim().to_lowercase();
    let mut parts = normalized.split('.');
    let size = parts.next()?.trim();
    let memory = parts.next()?.trim();
    let size: u32 = size.strip_suffix('g').unwrap_or(size).parse().ok()?;
    let gb: u32 = memory.strip_suffix("gb").unwrap_or(memory).parse().ok()?;
    ((1..=64).contains(&size) && (1..=16_384).contains(&gb)).then_some((size, gb))
}

/// Parses a container's whole-GCU request; `Ok(None)` when it asks for
/// none.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    config: &EnflameConfig,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    for name in config.unscheduled_names() {
        if reader.text(name).is_some() {
            reader.violate(
                name,
                format!(
                    "is not read by HAMi's Enflame scheduler either; ask for DRS partitions with {} or whole GCUs with {}",
                    config.drs_name(),
                    config.resource_name_gcu
                ),
            );
        }
    }
    crate::request::whole::parse(
        reader,
        kind,
        &config.resource_name_gcu,
        (DeviceFamily::Enflame, GCU_TYPE),
        Wording::new("GCU", ["", ""], [USE_UUID, NOUSE_UUID]),
    )
}

/// Parses a container's DRS request (HAMi's `device.go`): a number of
/// slices (`enflame.com/drs-gcu`), or memory and cores
/// (`enflame.com/gcu-memory`, `enflame.com/gcu-core` 1-100); one GCU,
/// cut as the profile the engine picks on each node. `Ok(None)` when it
/// asks for none.
pub(super) fn parse_drs(
    container: &Container,
    kind: ContainerKind,
    config: &EnflameConfig,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let slices = reader.read(config.drs_name(), 1, 64);
    let ask = match slices {
        Field::Value(n) => DrsAsk::Slices(narrow(n)),
        Field::Invalid => return reader.finish(None),
        Field::Absent => {
            let memory = reader.read(&config.resource_name_gcu_memory, 1, MAX_MEMORY_MIB);
            let cores = reader.read(&config.resource_name_gcu_core, 1, 100);
            match (memory, cores) {
                (Field::Absent, Field::Absent) => return reader.finish(None),
                (Field::Invalid, _) | (_, Field::Invalid) => return reader.finish(None),
                (memory, cores) => DrsAsk::Spec {
                    memory: if let Field::Value(m) = memory { m } else { 0 },
                    cores: if let Field::Value(c) = cores {
                        narrow(c)
                    } else {
                        0
                    },
                },
            }
        }
    };
    let name = reader.container.name.clone();
    reader.finish(Some(ContainerRequest {
        name,
        kind,
        count: 1,
        memory: MemoryRequest::Mib(0),
        cores: 0,
        priority: None,
        family: DeviceFamily::Enflame,
        vendor: Some(VendorRequest {
            device_type: Some(DRS_TYPE.to_owned()),
            drs: Some(ask),
            wording: Wording::new("DRS GCU", ["", ""], [USE_UUID, NOUSE_UUID]),
            ..VendorRequest::default()
        }),
    }))
}
