//! Vendors whose pods name a count, memory and cores, and nothing else, as
//! HAMi reads them: Hygon DCUs (`pkg/device/hygon/device.go`), Cambricon
//! MLUs (`pkg/device/cambricon/device.go`) and AMD GPUs
//! (`pkg/device/amd/device.go`), `GenerateResourceRequests`.
//!
//! - The count resource is the number of devices, each on a different
//!   card; without it the container asks for none (HAMi ignores memory and
//!   cores then; Tessera refuses them, since the kubelet could never
//!   satisfy them).
//! - Memory is per device, in the vendor's unit (Hygon: MiB times
//!   `memoryFactor`; Cambricon: 256 MiB); absent or 0: the whole card.
//! - Cores are percent of the card, **100 when absent** (a card is the
//!   container's alone unless it names cores); above 100 counts as 100
//!   (HAMi clamps in `Fit`). AMD: 1 to 100 only (HAMi's `MutateAdmission`
//!   refuses the rest), a percent of each GPU's compute units.
//! - Pod annotations filter by card type (substring, case-insensitive) and
//!   by UUID.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use crate::request::annotations::{types, uuids};
use crate::request::container::{Field, Reader, narrow};
use crate::request::types::Wording;
use crate::request::types::{
    ContainerKind, ContainerRequest, DeviceFilters, MAX_GPUS_PER_CONTAINER, MAX_MEMORY_MIB,
    MemoryRequest, VendorRequest,
};
use crate::request::vendors::{AmdConfig, CambriconConfig, HygonConfig};
use tessera_api::Violation;
use tessera_api::names::{amd, cambricon, hygon};
use tessera_api::v1alpha1::DeviceFamily;

/// One such vendor as configured.
pub(in crate::request::family) struct Simple<'a> {
    pub(in crate::request::family) family: DeviceFamily,
    pub(in crate::request::family) count: &'a str,
    pub(in crate::request::family) memory: &'a str,
    pub(in crate::request::family) cores: &'a str,
    /// MiB per unit of the memory resource.
    pub(in crate::request::family) memory_unit: u64,
    /// What one device is called.
    noun: &'static str,
    /// The type and UUID filter annotations: use, no-use type; use, no-use UUID.
    filters: [&'static str; 4],
    /// AMD: cores must be 1 to 100 (a percent of each GPU's compute units).
    cores_of_units: bool,
}

impl<'a> Simple<'a> {
    pub(in crate::request::family) fn hygon(config: &'a HygonConfig) -> Self {
        Self {
            family: DeviceFamily::Hygon,
            count: &config.resource_count_name,
            memory: &config.resource_memory_name,
            cores: &config.resource_core_name,
            memory_unit: u64::from(config.memory_factor.max(1)),
            noun: "DCU",
            filters: [
                hygon::USE_DCU_TYPE,
                hygon::NOUSE_DCU_TYPE,
                hygon::USE_UUID,
                hygon::NOUSE_UUID,
            ],
            cores_of_units: false,
        }
    }

    pub(in crate::request::family) fn cambricon(config: &'a CambriconConfig) -> Self {
        Self {
            family: DeviceFamily::Cambricon,
            count: &config.resource_count_name,
            memory: &config.resource_memory_name,
            cores: &config.resource_core_name,
            memory_unit: cambricon::MEMORY_UNIT_MIB,
            noun: "MLU",
            filters: [
                cambricon::USE_MLU_TYPE,
                cambricon::NOUSE_MLU_TYPE,
                cambricon::USE_UUID,
                cambricon::NOUSE_UUID,
            ],
            cores_of_units: false,
        }
    }

    pub(in crate::request::family) fn amd(config: &'a AmdConfig) -> Self {
        Self {
            family: DeviceFamily::Amd,
            count: &config.resource_count_name,
            memory: &config.resource_memory_name,
            cores: &config.resource_core_name,
            memory_unit: 1,
            noun: "AMD GPU",
            filters: [
                amd::USE_TYPE,
                amd::NOUSE_TYPE,
                amd::USE_UUID,
                amd::NOUSE_UUID,
            ],
            cores_of_units: true,
        }
    }
}

/// Parses a container's request; `Ok(None)` when it asks for none.
pub(in crate::request::family) fn parse(
    container: &Container,
    kind: ContainerKind,
    vendor: &Simple<'_>,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    // AMD's memory and cores may be left unnamed: never set then.
    let count = reader.read(vendor.count, 0, u64::from(MAX_GPUS_PER_CONTAINER));
    let memory = reader.read(vendor.memory, 0, MAX_MEMORY_MIB / vendor.memory_unit);
    let cores = if vendor.cores_of_units {
        reader.read(vendor.cores, 1, 100)
    } else {
        reader.read(vendor.cores, 0, u64::from(u32::MAX))
    };
    let count = match count {
        Field::Value(n) if n > 0 => n,
        Field::Invalid => return reader.finish(None),
        _ => {
            return reader.without_count(
                vendor.count,
                vendor.noun,
                &[(vendor.memory, &memory), (vendor.cores, &cores)],
            );
        }
    };
    let memory = match memory {
        Field::Value(units) if units > 0 => MemoryRequest::Mib(units * vendor.memory_unit),
        _ => MemoryRequest::Percent(100),
    };
    let cores = match cores {
        Field::Value(cores) => narrow(cores.min(100)),
        _ => 100,
    };
    let [use_type, nouse_type, use_uuid, nouse_uuid] = vendor.filters;
    let found = &mut reader.violations;
    let filters = DeviceFilters {
        use_types: types(annotations, use_type, found),
        nouse_types: types(annotations, nouse_type, found),
        use_uuids: uuids(annotations, use_uuid, found),
        nouse_uuids: uuids(annotations, nouse_uuid, found),
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(count),
        memory,
        cores,
        priority: None,
        family: vendor.family,
        vendor: Some(VendorRequest {
            filters,
            wording: Wording::new(
                vendor.noun,
                [vendor.filters[0], vendor.filters[1]],
                [vendor.filters[2], vendor.filters[3]],
            ),
            ..VendorRequest::default()
        }),
    }))
}
