//! Iluvatar GPUs, one chip per `iluvatars` entry, as HAMi reads them
//! (`pkg/device/iluvatar/device.go`: `MutateAdmission`,
//! `GenerateResourceRequests`).
//!
//! - `iluvatar.ai/<chip>-vgpu` is the number of GPUs; without it the
//!   container asks for none (and may not name the chip's memory or cores).
//! - `iluvatar.ai/<chip>.vMem` is memory per GPU in units of 256 MiB;
//!   absent or 0: the whole GPU.
//! - `iluvatar.ai/<chip>.vCore` is percent of the GPU's cores, 0 when
//!   absent; above 100 counts as 100. A container asking for more than one
//!   GPU gets them whole: HAMi's webhook writes 100 × count cores, which its
//!   `Fit` clamps to 100 per GPU.
//! - Pod annotations `hami.io/use-<chip>-uuid` / `hami.io/no-use-<chip>-uuid`
//!   filter by UUID.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use crate::request::annotations::uuids;
use crate::request::container::{Field, Reader, narrow};
use crate::request::types::Wording;
use crate::request::types::{
    ContainerKind, ContainerRequest, DeviceFilters, MAX_GPUS_PER_CONTAINER, MAX_MEMORY_MIB,
    MemoryRequest, VendorRequest,
};
use crate::request::vendors::IluvatarConfig;
use tessera_api::Violation;
use tessera_api::names::{ascend, iluvatar::MEMORY_UNIT_MIB};
use tessera_api::v1alpha1::DeviceFamily;

/// Parses a container's request for one Iluvatar chip; `Ok(None)` when it
/// asks for none.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    chip: &IluvatarConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let count = reader.read(
        &chip.resource_count_name,
        0,
        u64::from(MAX_GPUS_PER_CONTAINER),
    );
    let memory = reader.read(
        &chip.resource_memory_name,
        0,
        MAX_MEMORY_MIB / MEMORY_UNIT_MIB,
    );
    // An unnamed cores resource is never set.
    let cores = reader.read(&chip.resource_core_name, 0, u64::from(u32::MAX));
    let count = match count {
        Field::Value(n) if n > 0 => n,
        Field::Invalid => return reader.finish(None),
        _ => {
            return reader.without_count(
                &chip.resource_count_name,
                "GPU",
                &[
                    (&chip.resource_memory_name, &memory),
                    (&chip.resource_core_name, &cores),
                ],
            );
        }
    };
    let memory = match memory {
        Field::Value(units) if units > 0 => MemoryRequest::Mib(units * MEMORY_UNIT_MIB),
        _ => MemoryRequest::Percent(100),
    };
    let cores = match cores {
        _ if count > 1 => 100,
        Field::Value(cores) => narrow(cores.min(100)),
        _ => 0,
    };
    let filters = DeviceFilters {
        use_uuids: uuids(
            annotations,
            &ascend::use_uuid(&chip.common_word),
            &mut reader.violations,
        ),
        nouse_uuids: uuids(
            annotations,
            &ascend::nouse_uuid(&chip.common_word),
            &mut reader.violations,
        ),
        ..DeviceFilters::default()
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(count),
        memory,
        cores,
        priority: None,
        family: DeviceFamily::Iluvatar,
        vendor: Some(VendorRequest {
            device_type: Some(chip.common_word.clone()),
            filters,
            wording: Wording {
                noun: format!("{} GPU", chip.common_word).into(),
                use_uuid: ascend::use_uuid(&chip.common_word).into(),
                nouse_uuid: ascend::nouse_uuid(&chip.common_word).into(),
                ..Wording::default()
            },
            ..VendorRequest::default()
        }),
    }))
}
