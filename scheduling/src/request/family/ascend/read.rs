//! Huawei Ascend NPUs, one chip per `vnpus.configs` entry, as HAMi reads them
//! (`pkg/device/ascend/device.go`: `MutateAdmission`,
//! `GenerateResourceRequests`, `trimMemory`).
//!
//! - `huawei.com/<chip>` is the number of NPUs; without it the container
//!   asks for none (and may not name the chip's memory or cores).
//! - `huawei.com/<chip>-memory` is MiB per NPU (times `memoryFactor`). It
//!   rounds up to the smallest vNPU template that holds it, else to the whole
//!   card (`memoryAllocatable`) while it is within `memoryCapacity`; above
//!   that no card holds it. Absent: the whole card.
//! - A vNPU (a template smaller than the card) only with a count of 1.
//! - `huawei.com/<chip>-core` only with the pod annotation
//!   `huawei.com/vnpu-mode: hami-core` (HAMi's hami-vnpu-core soft split,
//!   where memory is taken as asked and cores are percent of the NPU).
//! - Ascend 910C in a SuperPod is allocated in module pairs: 1 becomes 2,
//!   other odd counts are refused.
//! - Pod annotations `hami.io/use-<chip>-uuid` / `hami.io/no-use-<chip>-uuid`
//!   filter by UUID.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use crate::request::annotations::uuids;
use crate::request::container::{Field, Reader, narrow};
use crate::request::shown::shown;
use crate::request::types::Wording;
use crate::request::types::{
    ContainerKind, ContainerRequest, DeviceFilters, MAX_GPUS_PER_CONTAINER, MAX_MEMORY_MIB,
    MemoryRequest, VendorRequest,
};
use crate::request::vendors::VnpuConfig;
use tessera_api::Violation;
use tessera_api::names::ascend::{HAMI_CORE, VNPU_MODE};
use tessera_api::v1alpha1::DeviceFamily;

/// Parses a container's request for one Ascend chip; `Ok(None)` when it
/// asks for none.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    chip: &VnpuConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let factor = u64::from(chip.memory_factor.max(1));
    let count = reader.read(&chip.resource_name, 0, u64::from(MAX_GPUS_PER_CONTAINER));
    let memory = reader.read(&chip.resource_memory_name, 0, MAX_MEMORY_MIB / factor);
    // An unnamed cores resource is never set.
    let cores = reader.read(&chip.resource_core_name, 0, u64::from(u32::MAX));
    let count = match count {
        Field::Value(n) if n > 0 => n,
        Field::Invalid => return reader.finish(None),
        _ => {
            return reader.without_count(
                &chip.resource_name,
                "NPU",
                &[
                    (&chip.resource_memory_name, &memory),
                    (&chip.resource_core_name, &cores),
                ],
            );
        }
    };
    // The pod's own count decides whether a vNPU is allowed (below), as in
    // HAMi's MutateAdmission; a 910C count of 1 then becomes its pair.
    let mut npus = count;
    if chip.pairs() {
        if count == 1 {
            npus = 2;
        } else if count % 2 == 1 {
            reader.violate(
                &chip.resource_name,
                format!(
                    "must be 1 or an even number, got {count}: {} NPUs are allocated in module pairs",
                    chip.common_word
                ),
            );
        }
    }
    let mode = annotations
        .and_then(|a| a.get(VNPU_MODE))
        .map(String::as_str);
    let soft_split = mode == Some(HAMI_CORE);
    if let Some(other) = mode.filter(|m| *m != HAMI_CORE) {
        reader.violations.push(Violation {
            container: None,
            field: VNPU_MODE.to_owned(),
            rule: format!(
                "must be {HAMI_CORE:?} (or absent for the driver's vNPU templates), got {}",
                shown(other)
            ),
        });
    }
    let cores = match cores {
        Field::Value(cores) if cores > 0 && !soft_split => {
            reader.violate(
                &chip.resource_core_name,
                format!(
                    "is only supported with the pod annotation {VNPU_MODE}: {HAMI_CORE} (soft split); a vNPU template fixes its AI cores"
                ),
            );
            0
        }
        Field::Value(cores) => narrow(cores.min(100)),
        _ => 0,
    };
    let asked = match memory {
        Field::Value(mib) if mib > 0 => Some(mib * factor),
        _ => None,
    };
    let (memory_mib, template) = match asked {
        None => (chip.memory_allocatable, None),
        Some(mib) if soft_split => (mib, None),
        Some(mib) => match chip.trim_memory(mib) {
            Some((mib, template)) => (mib, template.map(str::to_owned)),
            None => {
                reader.violate(
                    &chip.resource_memory_name,
                    format!(
                        "{mib} MiB is more than a {} card holds ({} MiB)",
                        chip.common_word, chip.memory_capacity
                    ),
                );
                (chip.memory_allocatable, None)
            }
        },
    };
    if count > 1 && !soft_split && memory_mib != chip.memory_allocatable {
        reader.violate(
            &chip.resource_memory_name,
            format!(
                "a vNPU ({} MiB, template {}) can only be asked for with {}: 1; ask for whole cards ({} MiB or no memory) when asking for {count}",
                memory_mib,
                template.as_deref().unwrap_or("-"),
                chip.resource_name,
                chip.memory_allocatable
            ),
        );
    }
    let filters = DeviceFilters {
        use_uuids: uuids(
            annotations,
            &chip.use_uuid_annotation(),
            &mut reader.violations,
        ),
        nouse_uuids: uuids(
            annotations,
            &chip.nouse_uuid_annotation(),
            &mut reader.violations,
        ),
        ..DeviceFilters::default()
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(npus),
        memory: MemoryRequest::Mib(memory_mib),
        cores,
        priority: None,
        family: DeviceFamily::Ascend,
        vendor: Some(VendorRequest {
            device_type: Some(chip.common_word.clone()),
            template,
            filters,
            soft_split,
            pairs: chip.pairs(),
            by_network: chip.is_910(),
            wording: Wording {
                noun: format!("{} NPU", chip.common_word).into(),
                use_uuid: tessera_api::names::ascend::use_uuid(&chip.common_word).into(),
                nouse_uuid: tessera_api::names::ascend::nouse_uuid(&chip.common_word).into(),
                ..Wording::default()
            },
            ..VendorRequest::default()
        }),
    }))
}
