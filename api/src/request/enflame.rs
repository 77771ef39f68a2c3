//! Enflame GCUs, as HAMi reads them (`pkg/device/enflame`).
//!
//! - `enflame.com/gcu` is a number of whole GCUs, one container per GCU
//!   (`gcu.go`).
//! - DRS partitions (`enflame.com/drs-gcu`, `enflame.com/gcu-memory`,
//!   `enflame.com/gcu-core`, `device.go`) are not scheduled by Tessera yet: a
//!   container naming them is refused, naming the resource, rather than
//!   placed without its partition.

use k8s_openapi::api::core::v1::Container;

use super::container::{Field, Reader, narrow};
use super::{
    ContainerKind, ContainerRequest, EnflameConfig, MAX_GPUS_PER_CONTAINER, MemoryRequest,
    VendorRequest,
};
use crate::Violation;
use crate::names::enflame::GCU_TYPE;
use crate::v1alpha1::DeviceFamily;

/// Parses a container's request; `Ok(None)` when it asks for none.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    config: &EnflameConfig,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader {
        container,
        violations: Vec::new(),
    };
    for name in config.unscheduled_names() {
        if reader.text(name).is_some() {
            reader.violate(
                name,
                format!(
                    "Enflame DRS partitions are not scheduled by Tessera yet; ask for whole GCUs with {}",
                    config.resource_name_gcu
                ),
            );
        }
    }
    let count = match reader.read(
        &config.resource_name_gcu,
        0,
        u64::from(MAX_GPUS_PER_CONTAINER),
    ) {
        Field::Value(n) if n > 0 => n,
        _ => return reader.finish(None),
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(count),
        memory: MemoryRequest::Percent(100),
        cores: 100,
        priority: None,
        family: DeviceFamily::Enflame,
        vendor: Some(VendorRequest {
            device_type: Some(GCU_TYPE.into()),
            ..VendorRequest::default()
        }),
    }))
}
