//! Vendors whose resource is a number of whole devices, as HAMi reads
//! them: one container per device (MetaX GPUs `metax-tech.com/gpu`, Enflame
//! GCUs `enflame.com/gcu`: [`parse`]), or as many as the plugin's `count`
//! (Vastai, Biren: [`counted`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use super::annotations::uuids;
use super::container::{Field, Reader, narrow};
use super::types::{
    ContainerKind, ContainerRequest, DeviceFilters, MAX_GPUS_PER_CONTAINER, MemoryRequest,
    VendorRequest, Wording,
};
use tessera_api::Violation;
use tessera_api::v1alpha1::DeviceFamily;

/// The container's request for `count` whole devices of `device_type`;
/// `Ok(None)` when it names none (or 0), the reader's violations when any
/// field it read was invalid.
pub(super) fn parse(
    mut reader: Reader<'_>,
    kind: ContainerKind,
    count: &str,
    (family, device_type): (DeviceFamily, &str),
    wording: Wording,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let count = match reader.read(count, 0, u64::from(MAX_GPUS_PER_CONTAINER)) {
        Field::Value(n) if n > 0 => n,
        _ => return reader.finish(None),
    };
    let name = reader.container.name.clone();
    reader.finish(Some(ContainerRequest {
        name,
        kind,
        count: narrow(count),
        memory: MemoryRequest::Percent(100),
        cores: 100,
        priority: None,
        family,
        vendor: Some(VendorRequest {
            device_type: Some(device_type.to_owned()),
            wording,
            ..VendorRequest::default()
        }),
    }))
}

/// The container's request for `count` devices its plugin counts but does
/// not measure (HAMi's Vastai and Biren `GenerateResourceRequests`): no
/// memory and no cores asked, so a device takes as many containers as the
/// `count` its plugin registers; the pod's UUID filters `uuid_filters`
/// (`[use, nouse]`) apply, as HAMi's `CheckUUID`. `Ok(None)` when it names
/// none (or 0).
pub(super) fn counted(
    container: &Container,
    kind: ContainerKind,
    count: &str,
    family: DeviceFamily,
    (annotations, [use_uuid, nouse_uuid]): (Option<&BTreeMap<String, String>>, [&str; 2]),
    wording: Wording,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let count = match reader.read(count, 0, u64::from(MAX_GPUS_PER_CONTAINER)) {
        Field::Value(n) if n > 0 => n,
        _ => return reader.finish(None),
    };
    let filters = DeviceFilters {
        use_uuids: uuids(annotations, use_uuid, &mut reader.violations),
        nouse_uuids: uuids(annotations, nouse_uuid, &mut reader.violations),
        ..DeviceFilters::default()
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(count),
        memory: MemoryRequest::Mib(0),
        cores: 0,
        priority: None,
        family,
        vendor: Some(VendorRequest {
            filters,
            wording,
            ..VendorRequest::default()
        }),
    }))
}
