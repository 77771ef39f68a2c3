//! [`parse_pod`]: every family's reader over every container of a pod.

use k8s_openapi::api::core::v1::Pod;

use super::config::RequestConfig;
use super::types::{ContainerKind, ContainerRequest, PodRequest};
use super::{
    annotations, ascend, container, enflame, iluvatar, kunlun, metax, mthreads, neuron, simple,
};
use crate::{Error, Result, Violation, Violations};

/// Parses a pod's GPU request; `Ok(None)` when it asks for no GPU.
///
/// Every broken rule is reported, not just the first, in
/// [`Error::InvalidPodRequest`].
pub fn parse_pod(pod: &Pod, config: &RequestConfig) -> Result<Option<PodRequest>> {
    let mut violations = Vec::new();
    let mut containers = Vec::new();
    if let Some(spec) = &pod.spec {
        let init = spec.init_containers.iter().flatten().map(|c| {
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            (
                c,
                if sidecar {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                },
            )
        });
        let app = spec.containers.iter().map(|c| (c, ContainerKind::App));
        let annotations = pod.metadata.annotations.as_ref();
        for (container, kind) in init.chain(app) {
            let mut collect = |parsed: Result<Option<ContainerRequest>, Vec<_>>| match parsed {
                Ok(Some(request)) => containers.push(request),
                Ok(None) => {}
                Err(mut found) => violations.append(&mut found),
            };
            collect(container::parse(container, kind, config));
            if let Some(hygon) = &config.hygon {
                collect(simple::parse(
                    container,
                    kind,
                    &simple::Simple::hygon(hygon),
                    annotations,
                ));
            }
            for chip in config.vnpus.iter().flat_map(|v| &v.configs) {
                collect(ascend::parse(container, kind, chip, annotations));
            }
            for chip in &config.iluvatars {
                collect(iluvatar::parse(container, kind, chip, annotations));
            }
            if let Some(mlu) = &config.cambricon {
                collect(simple::parse(
                    container,
                    kind,
                    &simple::Simple::cambricon(mlu),
                    annotations,
                ));
            }
            if let Some(mt) = &config.mthreads {
                collect(mthreads::parse(container, kind, mt, annotations));
            }
            if let Some(metax) = &config.metax {
                collect(metax::parse_gpu(container, kind, metax));
                collect(metax::parse_sgpu(container, kind, metax, annotations));
            }
            if let Some(gcu) = &config.enflame {
                collect(enflame::parse(container, kind, gcu));
                collect(enflame::parse_drs(container, kind, gcu));
            }
            if let Some(xpu) = &config.kunlun {
                collect(kunlun::parse_xpu(container, kind, xpu, annotations));
                collect(kunlun::parse_vxpu(container, kind, xpu, annotations));
            }
            if let Some(amd) = &config.amd {
                collect(simple::parse(
                    container,
                    kind,
                    &simple::Simple::amd(amd),
                    annotations,
                ));
            }
            if let Some(neuron) = &config.awsneuron {
                collect(neuron::parse(container, kind, neuron, annotations));
            }
        }
    }
    if containers.is_empty() && violations.is_empty() {
        return Ok(None);
    }
    // A vendor's list annotation is read by each of the family's containers;
    // refused once is enough.
    let mut refused: Vec<Violation> = Vec::new();
    violations.retain(|v| {
        let again = v.container.is_none() && refused.contains(v);
        if v.container.is_none() && !again {
            refused.push(v.clone());
        }
        !again
    });
    let annotations = pod.metadata.annotations.as_ref();
    let options = annotations::parse(annotations, &mut violations);
    if !violations.is_empty() {
        return Err(Error::InvalidPodRequest(Violations(violations)));
    }
    Ok(Some(PodRequest {
        containers,
        options,
    }))
}
