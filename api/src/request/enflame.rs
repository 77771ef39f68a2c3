//! Enflame GCUs, as HAMi reads them (`pkg/device/enflame`).
//!
//! - `enflame.com/gcu` is a number of whole GCUs, one container per GCU
//!   (`gcu.go`).
//! - DRS partitions (`enflame.com/drs-gcu`, `enflame.com/gcu-memory`,
//!   `enflame.com/gcu-core`, `device.go`) are not scheduled by Tessera yet: a
//!   container naming them is refused, naming the resource, rather than
//!   placed without its partition.

use k8s_openapi::api::core::v1::Container;

use super::container::Reader;
use super::{ContainerKind, ContainerRequest, EnflameConfig};
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
    super::whole::parse(
        reader,
        kind,
        &config.resource_name_gcu,
        (DeviceFamily::Enflame, GCU_TYPE),
    )
}
