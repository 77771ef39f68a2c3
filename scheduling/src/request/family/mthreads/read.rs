//! Moore Threads GPUs (`mthreads.com/vgpu`), as HAMi reads them
//! (`pkg/device/mthreads/device.go`: `MutateAdmission`,
//! `GenerateResourceRequests`, `customFilterRule`).
//!
//! - `mthreads.com/vgpu` is the number of GPUs; 0 is refused.
//! - `mthreads.com/sgpu-memory` is memory per GPU in units of 512 MiB, one
//!   of 2, 4, 8, 16, 32, 64 or 96 (a whole 48 GiB card).
//! - `mthreads.com/sgpu-core` is compute in sixteenths of a card (a card has
//!   16), 0 when absent.
//! - Without memory, or with more than one GPU, the container gets whole
//!   cards: 16 cores and 96 units each (HAMi's webhook writes 16n and 96n,
//!   which its request divides by n).
//! - Every container of a pod shares one card (HAMi's `customFilterRule`).
//! - Pod annotations `mthreads.ai/use-gpuuuid` / `nouse-gpuuuid` filter by UUID.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use crate::request::annotations::uuids;
use crate::request::container::{Field, Reader, narrow};
use crate::request::types::Wording;
use crate::request::types::{
    ContainerKind, ContainerRequest, DeviceFilters, MAX_GPUS_PER_CONTAINER, MemoryRequest,
    VendorRequest,
};
use crate::request::vendors::MthreadsConfig;
use tessera_api::Violation;
use tessera_api::names::mthreads::{
    CORES_PER_CARD, MEMORY_SLICES, MEMORY_UNIT_MIB, NOUSE_UUID, USE_UUID, WHOLE_CARD_UNITS,
};
use tessera_api::v1alpha1::DeviceFamily;

/// Parses a container's request; `Ok(None)` when it asks for none.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    config: &MthreadsConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let count = reader.read(
        &config.resource_count_name,
        0,
        u64::from(MAX_GPUS_PER_CONTAINER),
    );
    let memory = reader.read(&config.resource_memory_name, 0, u64::from(u32::MAX));
    // Up to 16 per GPU asked for: HAMi's webhook writes 16 × count for
    // whole cards, and a pod written by it must parse the same.
    let cores = reader.read(
        &config.resource_core_name,
        0,
        u64::from(CORES_PER_CARD) * u64::from(MAX_GPUS_PER_CONTAINER),
    );
    let count = match count {
        Field::Value(n) if n > 0 => n,
        Field::Value(_) => {
            reader.violate(
                &config.resource_count_name,
                "must be greater than 0".to_owned(),
            );
            return reader.finish(None);
        }
        Field::Invalid => return reader.finish(None),
        Field::Absent => {
            return reader.without_count(
                &config.resource_count_name,
                "GPU",
                &[
                    (&config.resource_memory_name, &memory),
                    (&config.resource_core_name, &cores),
                ],
            );
        }
    };
    let (units, cores) = match memory {
        _ if count > 1 => (WHOLE_CARD_UNITS, CORES_PER_CARD),
        Field::Absent => (WHOLE_CARD_UNITS, CORES_PER_CARD),
        Field::Value(units) if MEMORY_SLICES.contains(&units) => match cores {
            Field::Value(c) if c > u64::from(CORES_PER_CARD) => {
                reader.violate(
                    &config.resource_core_name,
                    format!("must be at most {CORES_PER_CARD} (a card's compute units) for one GPU, got {c}"),
                );
                (units, 0)
            }
            Field::Value(c) => (units, narrow(c)),
            _ => (units, 0),
        },
        Field::Value(units) => {
            reader.violate(
                &config.resource_memory_name,
                format!(
                    "must be one of 2, 4, 8, 16, 32, 64, 96 (units of {MEMORY_UNIT_MIB} MiB), got {units}"
                ),
            );
            (WHOLE_CARD_UNITS, CORES_PER_CARD)
        }
        Field::Invalid => (WHOLE_CARD_UNITS, CORES_PER_CARD),
    };
    let filters = DeviceFilters {
        use_uuids: uuids(annotations, USE_UUID, &mut reader.violations),
        nouse_uuids: uuids(annotations, NOUSE_UUID, &mut reader.violations),
        ..DeviceFilters::default()
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(count),
        memory: MemoryRequest::Mib(units * MEMORY_UNIT_MIB),
        cores,
        priority: None,
        family: DeviceFamily::Mthreads,
        vendor: Some(VendorRequest {
            filters,
            wording: Wording::new("Moore Threads GPU", ["", ""], [USE_UUID, NOUSE_UUID]),
            one_card_per_pod: true,
            ..VendorRequest::default()
        }),
    }))
}
