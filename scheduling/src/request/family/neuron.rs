//! AWS Neuron devices and NeuronCores: HAMi's `awsneuron:` section
//! (`pkg/device/awsneuron`).

use k8s_openapi::api::core::v1::Container;
use tessera_api::v1alpha1::DeviceFamily;

use super::{Annotations, Family, Parsed, Quota};
use crate::request::neuron;
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::AwsNeuronConfig;

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
        parsed.take(neuron::parse(container, kind, self, annotations));
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of("", 1, &self.resource_core_name)]
    }

    /// Only NeuronCores count; devices asked for by count do not.
    fn counts_quota(&self, request: &ContainerRequest) -> bool {
        request.vendor.as_ref().is_some_and(|v| v.by_core_index)
    }
}
