//! Moore Threads GPUs: HAMi's `mthreads:` section (`pkg/device/mthreads`).

mod admit;
mod read;

use k8s_openapi::api::core::v1::{Container, Pod};
use tessera_api::{
    names::mthreads::{self as names, MEMORY_UNIT_MIB},
    v1alpha1::DeviceFamily,
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::MthreadsConfig;

impl Family for MthreadsConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Mthreads
    }

    fn resources(&self) -> Vec<&str> {
        vec![
            &self.resource_count_name,
            &self.resource_memory_name,
            &self.resource_core_name,
        ]
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(read::parse(container, kind, self, annotations));
    }

    /// Only the Node's allocatable: 16 cores per card and the cards'
    /// memory in units of 512 MiB (HAMi's `GetNodeDevices`).
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Mthreads,
                &self.resource_count_name,
                SourceKind::Allocatable {
                    cores: self.resource_core_name.clone(),
                    memory: self.resource_memory_name.clone(),
                    unit_mib: MEMORY_UNIT_MIB,
                    per_card: names::CORES_PER_CARD,
                    infix: "mthreads",
                },
            )
            .device_type(names::DEVICE_TYPE),
        ]
    }

    fn admit_container(&self, container: &mut Container, wanted: &ContainerRequest) {
        admit::container(self, container, wanted);
    }

    fn admit_pod(&self, pod: &mut Pod, wanted: &[ContainerRequest]) {
        admit::pod(pod, wanted, |r| self.claims_request(r));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of(
            &self.resource_memory_name,
            MEMORY_UNIT_MIB,
            &self.resource_core_name,
        )]
    }
    /// HAMi's `mthreads-vgpu` allocated list and no list to allocate: Moore
    /// Threads' plugin reads the card indexes of the last container with
    /// GPUs, the time and the node. No lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let mine = |d: &tessera_api::v1alpha1::DeviceSlice| self.claims(d);
        if let Some(indexes) = binding.last_indexes(mine) {
            out.pod(names::GPU_INDEX, indexes);
            out.pod(names::PREDICATE_TIME, binding.nanoseconds());
            out.pod(names::PREDICATE_NODE, binding.spec.node_name.clone());
        }
        out.allocated(
            "mthreads-vgpu",
            binding.encode(mine, |_| names::DEVICE_TYPE, |d| d.cores),
        );
    }
}
