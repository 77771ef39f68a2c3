//! AWS Neuron devices, as HAMi reads them (`pkg/device/awsneuron`).
//!
//! - `aws.amazon.com/neuron` is a number of whole devices (it wins when a
//!   container names both resources, as in HAMi).
//! - `aws.amazon.com/neuroncore` is a number of NeuronCores: 1 or 2 on one
//!   device, or a multiple of 2 as that many whole devices (HAMi splits by
//!   two cores per device, its cap); other counts are refused with HAMi's
//!   rule.
//! - More than one device are consecutive free devices (the engine's
//!   `contiguous` rule).
//! - `aws.amazon.com/use-neuron-uuid` / `nouse-neuron-uuid` filter by UUID.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use crate::request::annotations::uuids;
use crate::request::container::{Field, Reader, narrow};
use crate::request::types::Wording;
use crate::request::types::{
    ContainerKind, ContainerRequest, DeviceFilters, MAX_GPUS_PER_CONTAINER, MemoryRequest,
    VendorRequest,
};
use crate::request::vendors::AwsNeuronConfig;
use tessera_api::Violation;
use tessera_api::names::neuron::{MAX_CORES_PER_DEVICE, NOUSE_UUID, USE_UUID};
use tessera_api::v1alpha1::DeviceFamily;

/// A request's cores meaning "the whole device, whatever its cores" (the
/// engine gives such a slice every core of its device).
const WHOLE: u32 = 100;

/// Parses a container's request; `Ok(None)` when it asks for none.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    config: &AwsNeuronConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let max_devices = u64::from(MAX_GPUS_PER_CONTAINER);
    // 0 is refused, as HAMi's admission does ("must be greater than 0").
    let devices = reader.read(&config.resource_count_name, 1, max_devices);
    let by_core_index = !matches!(devices, Field::Value(n) if n > 0);
    let (count, cores) = match devices {
        Field::Value(n) if n > 0 => (n, WHOLE),
        Field::Invalid => return reader.finish(None),
        _ => {
            let per_device = u64::from(MAX_CORES_PER_DEVICE);
            match reader.read(&config.resource_core_name, 1, max_devices * per_device) {
                Field::Value(0) | Field::Absent | Field::Invalid => return reader.finish(None),
                Field::Value(c) if c <= per_device => (1, narrow(c)),
                Field::Value(c) if c % per_device == 0 => (c / per_device, WHOLE),
                Field::Value(c) => {
                    reader.violate(
                        &config.resource_core_name,
                        format!("must be 1 or a multiple of {per_device}, got {c}"),
                    );
                    return reader.finish(None);
                }
            }
        }
    };
    let name = reader.container.name.clone();
    let filters = DeviceFilters {
        use_uuids: uuids(annotations, USE_UUID, &mut reader.violations),
        nouse_uuids: uuids(annotations, NOUSE_UUID, &mut reader.violations),
        ..DeviceFilters::default()
    };
    reader.finish(Some(ContainerRequest {
        name,
        kind,
        count: narrow(count),
        // Neuron devices have no memory to share.
        memory: MemoryRequest::Percent(100),
        cores,
        priority: None,
        family: DeviceFamily::AwsNeuron,
        vendor: Some(VendorRequest {
            filters,
            wording: Wording::new("Neuron device", ["", ""], [USE_UUID, NOUSE_UUID]),
            contiguous: count > 1,
            by_core_index,
            ..VendorRequest::default()
        }),
    }))
}
