//! MetaX GPUs, whole and as sGPUs: HAMi's `metax:` section
//! (`pkg/device/metax`).

mod admit;
mod read;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;
use tessera_api::{
    names::metax::{
        ALLOCATED, GPU_MEMORY_MIB, GPU_TYPE, NODE_DEVICES, PREDICATE_TIME, SGPU_TYPE,
        VMEMORY_UNIT_MIB,
    },
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::handoff::is_zero;
use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::MetaxConfig;

/// One sGPU as MetaX's `metax-tech.com/gpu-devices-allocated` lists it
/// (HAMi `ContainerMetaxSDevice`, Go's omitempty kept).
#[derive(Serialize)]
struct SDevice<'a> {
    uuid: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    compute: u32,
    #[serde(rename = "vRam", skip_serializing_if = "is_zero")]
    v_ram: u64,
}

impl Family for MetaxConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Metax
    }

    fn resources(&self) -> Vec<&str> {
        vec![
            &self.resource_count_name,
            &self.resource_vcount_name,
            &self.resource_vmemory_name,
            &self.resource_vcore_name,
        ]
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(read::parse_gpu(container, kind, self));
        parsed.take(read::parse_sgpu(container, kind, self, annotations));
    }

    /// Only sGPUs count: whole GPUs have a count resource of their own.
    /// Whole GPUs from the count resource alone (`<node>-metax-<i>`,
    /// 65,536 MiB each, with the plugin's topology maps); sGPUs from
    /// MetaX's JSON list (`metax-tech.com/node-gpu-devices`), no handshake.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source {
                topology_maps: true,
                ..Source::new(
                    DeviceFamily::Metax,
                    &self.resource_count_name,
                    SourceKind::Cards {
                        memory_mib: GPU_MEMORY_MIB,
                        infix: "metax",
                    },
                )
                .device_type(GPU_TYPE)
            },
            Source::new(
                DeviceFamily::Metax,
                &self.resource_vcount_name,
                SourceKind::MetaxJson,
            )
            .register(NODE_DEVICES)
            .device_type(SGPU_TYPE),
        ]
    }

    fn admit_pod(&self, pod: &mut Pod, wanted: &[ContainerRequest]) {
        admit::pod(pod, wanted, |r| self.claims_request(r));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![
            Quota::of(
                &self.resource_vmemory_name,
                VMEMORY_UNIT_MIB,
                &self.resource_vcore_name,
            )
            .for_type(SGPU_TYPE),
        ]
    }
    /// Whole GPUs: HAMi's two `metax-gpu` lists, no lock. sGPUs: HAMi's
    /// two `metax-sgpu` lists, every container's sGPUs as the JSON MetaX's
    /// plugin reads (`metax-tech.com/gpu-devices-allocated`), the time, and
    /// the Node's mutex lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let gpu = |d: &DeviceSlice| d.family == DeviceFamily::Metax && d.model != SGPU_TYPE;
        let sgpu = |d: &DeviceSlice| d.family == DeviceFamily::Metax && d.model == SGPU_TYPE;
        if binding.any(gpu) {
            out.lists("metax-gpu", binding.encode(gpu, |_| GPU_TYPE, |d| d.cores));
        }
        if binding.any(sgpu) {
            out.lists(
                "metax-sgpu",
                binding.encode(sgpu, |_| SGPU_TYPE, |d| d.cores),
            );
            let per_container: Vec<Vec<SDevice<'_>>> = binding
                .per_container(sgpu)
                .into_iter()
                .map(|(_, slices)| {
                    slices
                        .into_iter()
                        .map(|d| SDevice {
                            uuid: &d.uuid,
                            compute: d.cores,
                            v_ram: d.memory_mib,
                        })
                        .collect()
                })
                .collect();
            out.pod(
                ALLOCATED,
                serde_json::to_string(&per_container).unwrap_or_else(|_| "[]".into()),
            );
            out.pod(PREDICATE_TIME, binding.nanoseconds());
            out.mutex_lock(binding);
        }
    }
}
