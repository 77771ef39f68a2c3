//! MetaX GPUs, as HAMi reads them (`pkg/device/metax`): whole GPUs
//! (`device.go`) and shared sGPUs (`sdevice.go`, `GenerateResourceRequests`).
//!
//! - `metax-tech.com/gpu` is a number of whole GPUs: all their memory and
//!   compute, one container per GPU.
//! - `metax-tech.com/sgpu` is a number of sGPUs, each on a different GPU;
//!   `metax-tech.com/vcore` is percent of a GPU's compute (100 when absent,
//!   above 100 counts as 100); `metax-tech.com/vmemory` is memory per sGPU:
//!   a bare number is GiB, a quantity with a unit is bytes (`4Gi`,
//!   `4096Mi`; whole MiB); absent or 0: the whole GPU's memory.
//! - Pod annotations `metax-tech.com/use-gpuuuid` / `nouse-gpuuuid` filter
//!   sGPUs by UUID.
//! - `metax-tech.com/sgpu-app-class` is `online` or `offline` and then the
//!   container takes exactly one sGPU; a pod that is not `online` names a
//!   QoS policy in `metax-tech.com/sgpu-qos-policy` (`best-effort`,
//!   `fixed-share`, `burst-share`; the webhook writes `best-effort` when it
//!   names none), which MetaX's plugin applies.

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
use crate::request::vendors::MetaxConfig;
use tessera_api::Violation;
use tessera_api::names::metax::{
    APP_CLASS, GPU_TYPE, NOUSE_UUID, QOS_POLICIES, QOS_POLICY, SGPU_TYPE, TOPOLOGY_AWARE, USE_UUID,
    VMEMORY_UNIT_MIB,
};
use tessera_api::quantity::bytes_as_mib;
use tessera_api::v1alpha1::{AppClass, DeviceFamily, QosPolicy, Sharing};

/// Parses a container's whole-GPU request; `Ok(None)` when it asks for none.
pub(super) fn parse_gpu(
    container: &Container,
    kind: ContainerKind,
    config: &MetaxConfig,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let reader = Reader::new(container);
    crate::request::whole::parse(
        reader,
        kind,
        &config.resource_count_name,
        (DeviceFamily::Metax, GPU_TYPE),
        Wording::new("MetaX GPU", ["", ""], [USE_UUID, NOUSE_UUID]),
    )
}

/// Parses a container's sGPU request; `Ok(None)` when it asks for none.
pub(super) fn parse_sgpu(
    container: &Container,
    kind: ContainerKind,
    config: &MetaxConfig,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let mut reader = Reader::new(container);
    let count = reader.read(
        &config.resource_vcount_name,
        0,
        u64::from(MAX_GPUS_PER_CONTAINER),
    );
    let cores = reader.read(&config.resource_vcore_name, 0, u64::from(u32::MAX));
    let memory = read_vmemory(&mut reader, &config.resource_vmemory_name);
    let count = match count {
        Field::Value(n) if n > 0 => n,
        Field::Invalid => return reader.finish(None),
        _ => {
            return reader.without_count(
                &config.resource_vcount_name,
                "sGPU",
                &[
                    (config.resource_vmemory_name.as_str(), &memory),
                    (config.resource_vcore_name.as_str(), &cores),
                ],
            );
        }
    };
    let memory = match memory {
        Field::Value(mib) if mib > 0 => MemoryRequest::Mib(mib),
        _ => MemoryRequest::Percent(100),
    };
    let cores = match cores {
        Field::Value(cores) => narrow(cores.min(100)),
        _ => 100,
    };
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    // HAMi's MutateAdmission: an app class is online or offline and takes
    // one sGPU; a pod that is not online names a known QoS policy (the
    // webhook writes best-effort when it names none).
    let app_class = get(APP_CLASS);
    match app_class {
        Some("online" | "offline") if count != 1 => reader.violate(
            APP_CLASS,
            format!(
                "a pod with an app class must ask for exactly 1 sGPU, but {} is {count}",
                config.resource_vcount_name
            ),
        ),
        Some("online" | "offline") | None => {}
        Some(other) => reader.violate(
            APP_CLASS,
            format!("must be online or offline, got {}", shown(other)),
        ),
    }
    let online = app_class == Some("online");
    let qos_policy = get(QOS_POLICY).and_then(QosPolicy::parse);
    if !online
        && let Some(qos) = get(QOS_POLICY)
        && qos_policy.is_none()
    {
        reader.violate(
            QOS_POLICY,
            format!(
                "must be one of {}, got {}",
                QOS_POLICIES.join(", "),
                shown(qos)
            ),
        );
    }
    let sharing = Sharing {
        app_class: match app_class {
            Some("online") => Some(AppClass::Online),
            Some("offline") => Some(AppClass::Offline),
            _ => None,
        },
        qos_policy: qos_policy.filter(|_| !online),
    };
    // HAMi's topologyAwareEnable: the annotation as Go's ParseBool reads
    // it, else the configuration.
    let topology_aware = match get(TOPOLOGY_AWARE) {
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
        _ => config.sgpu_topology_aware,
    };
    let filters = DeviceFilters {
        use_uuids: uuids(annotations, USE_UUID, &mut reader.violations),
        nouse_uuids: uuids(annotations, NOUSE_UUID, &mut reader.violations),
        ..DeviceFilters::default()
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: narrow(count),
        memory,
        cores,
        priority: None,
        family: DeviceFamily::Metax,
        vendor: Some(VendorRequest {
            device_type: Some(SGPU_TYPE.into()),
            // HAMi prefers whole MetaLinks only for pods without an app class.
            by_link_zone: cores == 100 && sharing.app_class.is_none(),
            sharing: Some(sharing),
            topology_aware: topology_aware && cores == 100 && !online,
            filters,
            wording: Wording::new("MetaX sGPU", ["", ""], [USE_UUID, NOUSE_UUID]),
            ..VendorRequest::default()
        }),
    }))
}

/// `metax-tech.com/vmemory` in MiB: a bare number is GiB, a quantity with a
/// unit is bytes and must be whole MiB.
fn read_vmemory(reader: &mut Reader<'_>, name: &str) -> Field {
    let Some(text) = reader.text(name) else {
        return Field::Absent;
    };
    if !text.contains(|c: char| c.is_ascii_alphabetic()) {
        return reader
            .read(name, 0, MAX_MEMORY_MIB / VMEMORY_UNIT_MIB)
            .scaled(VMEMORY_UNIT_MIB);
    }
    match bytes_as_mib(&text) {
        Ok(mib) if mib <= MAX_MEMORY_MIB => Field::Value(mib),
        Ok(mib) => {
            reader.violate(
                name,
                format!("must be at most {MAX_MEMORY_MIB} MiB, got {mib} MiB"),
            );
            Field::Invalid
        }
        Err(rule) => {
            reader.violate(
                name,
                format!(
                    "{rule}; a bare number is GiB, a quantity with a unit (4Gi, 4096Mi) is bytes"
                ),
            );
            Field::Invalid
        }
    }
}
