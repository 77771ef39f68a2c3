//! What HAMi's webhook writes for MetaX pods (`MutateAdmission`).

use k8s_openapi::api::core::v1::Pod;
use tessera_api::names::metax::{APP_CLASS, QOS_POLICY, SGPU_TYPE};

use crate::request::types::ContainerRequest;

/// `metax-tech.com/sgpu-qos-policy: best-effort` for an sGPU pod (among
/// the requests `mine` selects) that is not online and names no policy:
/// MetaX's sGPU plugin reads the policy.
pub(super) fn pod(
    pod: &mut Pod,
    wanted: &[ContainerRequest],
    mine: impl Fn(&ContainerRequest) -> bool,
) {
    let sgpu = wanted.iter().any(|r| {
        mine(r) && r.vendor.as_ref().and_then(|v| v.device_type.as_deref()) == Some(SGPU_TYPE)
    });
    let named = |key: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(key));
    if sgpu && named(APP_CLASS).map(String::as_str) != Some("online") && named(QOS_POLICY).is_none()
    {
        pod.metadata
            .annotations
            .get_or_insert_default()
            .insert(QOS_POLICY.to_owned(), "best-effort".to_owned());
    }
}
