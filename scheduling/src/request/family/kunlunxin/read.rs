//! Kunlunxin XPUs, as HAMi reads them (`pkg/device/kunlun`).
//!
//! - `kunlunxin.com/xpu` is a number of whole XPUs (`device.go`).
//! - `kunlunxin.com/vxpu` is a number of vXPUs, each of
//!   `kunlunxin.com/vxpu-memory` MiB rounded up to 24576, 49152 or 98304
//!   (a quarter, half or whole XPU, with that share of its cores; 0 rounds
//!   to a quarter, as in HAMi); without memory, a whole XPU (`vdevice.go`).
//! - Either way the XPUs come 1, 2, 4 or 8 at a time: HAMi's `graghSelect`
//!   places no other count, so a pod asking for 3 would wait forever there;
//!   Tessera refuses it at admission.
//! - `hami.io/use-xpu-uuid` / `hami.io/no-use-xpu-uuid` filter by UUID, as
//!   do Kunlunxin's `baidu.com/use-gpuuuid` / `baidu.com/nouse-gpuuuid`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use crate::request::annotations::uuids;
use crate::request::container::{Field, Reader, narrow};
use crate::request::types::Wording;
use crate::request::types::{
    ContainerKind, ContainerRequest, DeviceFilters, MAX_MEMORY_MIB, MemoryRequest, VendorRequest,
};
use crate::request::vendors::KunlunConfig;
use tessera_api::Violation;
use tessera_api::names::kunlun::{
    BAIDU_NOUSE_UUID, BAIDU_USE_UUID, COUNTS, NOUSE_UUID, USE_UUID, VXPU_SIZES_MIB, VXPU_TYPE,
    XPU_MEMORY_MIB, XPU_TYPE,
};
use tessera_api::v1alpha1::DeviceFamily;

/// Whole XPUs; `Ok(None)` when the container names none.
pub(super) fn parse_xpu(
    container: &Container,
    kind: ContainerKind,
    config: &KunlunConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let Some(count) = read_count(&mut reader, &config.resource_count_name) else {
        return reader.finish(None);
    };
    let request = request(
        &mut reader,
        kind,
        count,
        XPU_MEMORY_MIB,
        XPU_TYPE,
        annotations,
    );
    reader.finish(Some(request))
}

/// vXPUs; `Ok(None)` when the container names none.
pub(super) fn parse_vxpu(
    container: &Container,
    kind: ContainerKind,
    config: &KunlunConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let memory = reader.read(&config.resource_vmemory_name, 0, MAX_MEMORY_MIB);
    let Some(count) = read_count(&mut reader, &config.resource_vcount_name) else {
        if !matches!(memory, Field::Absent) {
            return reader.without_count(
                &config.resource_vcount_name,
                "vXPU",
                &[(&config.resource_vmemory_name, &memory)],
            );
        }
        return reader.finish(None);
    };
    // HAMi rounds any memory named, 0 included, to a vXPU size.
    let mib = match memory {
        Field::Value(mib) => vxpu_size(mib),
        _ => XPU_MEMORY_MIB,
    };
    let mut request = request(&mut reader, kind, count, mib, VXPU_TYPE, annotations);
    if let Some(vendor) = request.vendor.as_mut() {
        vendor.same_size = true;
    }
    reader.finish(Some(request))
}

/// The vXPU size `mib` rounds up to (HAMi's `trimMemory`: above the half
/// size, a whole XPU).
fn vxpu_size(mib: u64) -> u64 {
    VXPU_SIZES_MIB
        .into_iter()
        .find(|&size| mib <= size)
        .unwrap_or(XPU_MEMORY_MIB)
}

/// The count (1, 2, 4 or 8); `None` when absent, 0 or invalid (then the
/// reader holds the violation).
fn read_count(reader: &mut Reader<'_>, name: &str) -> Option<u64> {
    match reader.read(name, 0, 8) {
        Field::Value(0) | Field::Absent | Field::Invalid => None,
        Field::Value(n) if COUNTS.contains(&n) => Some(n),
        Field::Value(n) => {
            reader.violate(
                name,
                format!(
                    "must be 1, 2, 4 or 8, got {n}: Kunlunxin XPUs are placed in whole wings of four or linked sets (HAMi places no other count)"
                ),
            );
            None
        }
    }
}

fn request(
    reader: &mut Reader<'_>,
    kind: ContainerKind,
    count: u64,
    mib: u64,
    device_type: &str,
    annotations: Option<&BTreeMap<String, String>>,
) -> ContainerRequest {
    // Each annotation is bounded, so the union of two is too.
    let found = &mut reader.violations;
    let use_uuids = match uuids(annotations, USE_UUID, found) {
        hami if hami.is_empty() => uuids(annotations, BAIDU_USE_UUID, found),
        hami => hami,
    };
    let mut nouse_uuids = uuids(annotations, NOUSE_UUID, found);
    nouse_uuids.extend(uuids(annotations, BAIDU_NOUSE_UUID, found));
    ContainerRequest {
        name: reader.container.name.clone(),
        kind,
        count: narrow(count),
        memory: MemoryRequest::Mib(mib),
        // A quarter, half or whole XPU's cores with its memory.
        cores: narrow(mib * 100 / XPU_MEMORY_MIB),
        priority: None,
        family: DeviceFamily::Kunlunxin,
        vendor: Some(VendorRequest {
            device_type: Some(device_type.to_owned()),
            filters: DeviceFilters {
                use_uuids,
                nouse_uuids,
                ..DeviceFilters::default()
            },
            by_wing: true,
            wording: Wording::new(
                if device_type == VXPU_TYPE {
                    "vXPU"
                } else {
                    "XPU"
                },
                ["", ""],
                [USE_UUID, NOUSE_UUID],
            ),
            ..VendorRequest::default()
        }),
    }
}
