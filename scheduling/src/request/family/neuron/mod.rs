//! AWS Neuron devices and NeuronCores: HAMi's `awsneuron:` section
//! (`pkg/device/awsneuron`).

mod read;

use k8s_openapi::api::core::v1::Container;
use tessera_api::{
    names::neuron::{
        ALLOCATED, ALLOCATED_FLAG, ASSIGNED_INDEX, DEVICE_TYPE, PREDICATE_NODE, PREDICATE_TIME,
        RESOURCE_TYPE,
    },
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::AwsNeuronConfig;

/// A Neuron slice's cores as HAMi encodes them: the mask of the cores it
/// holds (a slice by count holds every core of its device).
fn core_mask(slice: &DeviceSlice) -> u32 {
    if slice.core_indexes.is_empty() {
        1u32.checked_shl(slice.cores).map_or(u32::MAX, |m| m - 1)
    } else {
        slice
            .core_indexes
            .iter()
            .filter(|&&i| i < 32)
            .fold(0, |mask, &i| mask | (1 << i))
    }
}

impl Family for AwsNeuronConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::AwsNeuron
    }

    fn resources(&self) -> Vec<&str> {
        vec![&self.resource_count_name, &self.resource_core_name]
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

    /// Only the Node's allocatable: the count resource's devices, each
    /// with an equal share of the NeuronCores.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::AwsNeuron,
                &self.resource_count_name,
                SourceKind::Neuron {
                    cores: self.resource_core_name.clone(),
                },
            )
            .device_type(DEVICE_TYPE),
        ]
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of("", 1, &self.resource_core_name)]
    }

    /// Only NeuronCores count; devices asked for by count do not.
    fn counts_quota(&self, request: &ContainerRequest) -> bool {
        request.vendor.as_ref().is_some_and(|v| v.by_core_index)
    }
    /// HAMi's `aws-neuron-devices-allocated` list (each device's cores as
    /// the mask of the cores it holds), the time, the allocated flag and
    /// the node; then AWS's `AWS_NEURON_IDS`: a device's index for a
    /// container that asked for devices, else the node's numbers of its
    /// cores (device index × the device's cores + core, HAMi's
    /// `PatchAnnotations`), with `NEURON_RESOURCE_TYPE` naming the core
    /// resource when any container asked for cores. No lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let mine = |d: &DeviceSlice| self.claims(d);
        out.pod(ALLOCATED, binding.encode(mine, |_| DEVICE_TYPE, core_mask));
        out.pod(PREDICATE_TIME, binding.nanoseconds());
        out.pod(ALLOCATED_FLAG, "false");
        out.pod(PREDICATE_NODE, binding.spec.node_name.clone());
        let mut ids = Vec::new();
        let mut by_core = false;
        for (_, slices) in binding.per_container(mine) {
            for d in slices {
                if d.core_indexes.is_empty() {
                    ids.push(d.index);
                } else {
                    by_core = true;
                    let per_device = binding.device(&d.uuid).map_or(0, |g| g.cores);
                    let first = d.index.saturating_mul(per_device);
                    ids.extend(d.core_indexes.iter().map(|c| first.saturating_add(*c)));
                }
            }
        }
        let listed: Vec<String> = ids.iter().map(u32::to_string).collect();
        out.pod(ASSIGNED_INDEX, listed.join(","));
        if by_core {
            out.pod(RESOURCE_TYPE, self.resource_core_name.clone());
        }
    }
}
