//! [`parse_pod`]: every family's reader ([`super::Family::parse`]) over
//! every container of a pod.

use k8s_openapi::api::core::v1::Pod;

use super::annotations;
use super::config::RequestConfig;
use super::family::Parsed;
use super::types::{ContainerKind, PodRequest};
use tessera_api::{Error, Result, Violation, Violations};

/// Parses a pod's GPU request; `Ok(None)` when it asks for no GPU.
///
/// Every broken rule is reported, not just the first, in
/// [`Error::InvalidPodRequest`].
pub fn parse_pod(pod: &Pod, config: &RequestConfig) -> Result<Option<PodRequest>> {
    let mut parsed = Parsed::default();
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
        let families = config.families();
        for (container, kind) in init.chain(app) {
            for family in families.iter() {
                family.parse(container, kind, annotations, &mut parsed);
            }
        }
    }
    let Parsed {
        requests: containers,
        mut violations,
    } = parsed;
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
