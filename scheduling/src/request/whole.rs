//! Vendors whose resource is a number of whole devices, one container per
//! device, as HAMi reads them: MetaX GPUs (`metax-tech.com/gpu`) and Enflame
//! GCUs (`enflame.com/gcu`).

use super::container::{Field, Reader, narrow};
use super::types::{
    ContainerRequest, MAX_GPUS_PER_CONTAINER, MemoryRequest, VendorRequest, Wording,
};
use tessera_api::Violation;
use tessera_api::v1alpha1::DeviceFamily;

/// The container's request for `count` whole devices of `device_type`;
/// `Ok(None)` when it names none (or 0), the reader's violations when any
/// field it read was invalid.
pub(super) fn parse(
    mut reader: Reader<'_>,
    kind: super::types::ContainerKind,
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
