//! Hygon DCUs: `hygon.com/dcunum`, `dcumem`, `dcucores`, as HAMi reads them
//! (`pkg/device/hygon/device.go`, `GenerateResourceRequests`).
//!
//! - `dcunum` is the number of DCUs, each on a different card; without it
//!   the container asks for no DCU (HAMi ignores `dcumem`/`dcucores` then;
//!   Tessera refuses them, since the kubelet could never satisfy them).
//! - `dcumem` is MiB per DCU (times `memoryFactor`); absent or 0: the whole card.
//! - `dcucores` is percent of the card's compute units, 100 when absent;
//!   above 100 counts as 100 (HAMi clamps in `Fit`).
//! - Pod annotations `hygon.com/use-dcutype` / `nouse-dcutype` filter by
//!   card type (substring, case-insensitive), `hygon.com/use-gpuuuid` /
//!   `nouse-gpuuuid` by UUID.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use super::annotations::list;
use super::container::{Field, Reader, narrow};
use super::{
    ContainerKind, ContainerRequest, DeviceFilters, HygonConfig, MAX_GPUS_PER_CONTAINER,
    MAX_MEMORY_MIB, MemoryRequest, VendorRequest,
};
use crate::Violation;
use crate::names::hygon::{NOUSE_DCU_TYPE, NOUSE_UUID, USE_DCU_TYPE, USE_UUID};
use crate::v1alpha1::DeviceFamily;

/// Parses a container's DCU request; `Ok(None)` when it asks for none.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    config: &HygonConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader {
        container,
        violations: Vec::new(),
    };
    let factor = u64::from(config.memory_factor.max(1));
    let count = reader.read(
        &config.resource_count_name,
        0,
        u64::from(MAX_GPUS_PER_CONTAINER),
    );
    let memory = reader.read(&config.resource_memory_name, 0, MAX_MEMORY_MIB / factor);
    let cores = reader.read(&config.resource_core_name, 0, u64::from(u32::MAX));
    let count = match count {
        Field::Value(n) if n > 0 => n,
        Field::Invalid => return reader.finish(None),
        _ => {
            for (name, field) in [
                (&config.resource_memory_name, &memory),
                (&config.resource_core_name, &cores),
            ] {
                if !matches!(field, Field::Absent) {
                    reader.violate(
                        name,
                        format!(
                            "is set but {} is not; ask for at least 1 DCU",
                            config.resource_count_name
                        ),
                    );
                }
            }
            return reader.finish(None);
        }
    };
    let memory = match memory {
        Field::Value(mib) if mib > 0 => MemoryRequest::Mib(mib * factor),
        _ => MemoryRequest::Percent(100),
    };
    let cores = match cores {
        Field::Value(cores) => narrow(cores.min(100)),
        _ => 100,
    };
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(count),
        memory,
        cores,
        priority: None,
        family: DeviceFamily::Hygon,
        vendor: Some(VendorRequest {
            filters: DeviceFilters {
                use_types: list(get(USE_DCU_TYPE)),
                nouse_types: list(get(NOUSE_DCU_TYPE)),
                use_uuids: list(get(USE_UUID)),
                nouse_uuids: list(get(NOUSE_UUID)),
            },
            ..VendorRequest::default()
        }),
    }))
}
