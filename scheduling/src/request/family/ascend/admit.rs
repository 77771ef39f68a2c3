//! What HAMi's webhook writes for Ascend pods (`MutateAdmission`).

use k8s_openapi::{
    api::core::v1::{Container, EnvVar, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use tessera_api::names::ascend::VISIBLE_DEVICES;

use crate::request::types::ContainerRequest;
use crate::request::vendors::VnpusConfig;

/// The container's memory rounded up to the vNPU template (or the whole
/// card), and a 910C count of 1 raised to the module pair, in limits and,
/// where present, requests, so the kubelet accounts what the plugin hands
/// out.
pub(super) fn container(
    config: &VnpusConfig,
    container: &mut Container,
    wanted: &ContainerRequest,
) {
    let Some(chip) = wanted
        .vendor
        .as_ref()
        .and_then(|v| v.device_type.as_deref())
        .and_then(|t| config.configs.iter().find(|c| c.common_word == t))
    else {
        return;
    };
    let memory = wanted.memory.resolve(0) / u64::from(chip.memory_factor.max(1));
    let resources = container.resources.get_or_insert_default();
    for (key, value) in [
        (&chip.resource_name, wanted.count.to_string()),
        (&chip.resource_memory_name, memory.to_string()),
    ] {
        resources
            .limits
            .get_or_insert_default()
            .insert(key.clone(), Quantity(value.clone()));
        if let Some(requests) = resources.requests.as_mut() {
            requests.insert(key.clone(), Quantity(value));
        }
    }
}

/// A chip's `runtimeClassName` on a pod asking for that chip's NPUs that
/// names no RuntimeClass, and, for a chip with `overwriteEnv`, an empty
/// `ASCEND_VISIBLE_DEVICES` in every container that asks for no Ascend NPU
/// (so Ascend's runtime hands it none) unless the container sets it.
pub(super) fn pod(
    config: &VnpusConfig,
    pod: &mut Pod,
    wanted: &[ContainerRequest],
    mine: impl Fn(&ContainerRequest) -> bool,
) {
    let chips = config.configs.iter();
    let asks_chip = |chip: &str| {
        wanted.iter().any(|r| {
            mine(r) && r.vendor.as_ref().and_then(|v| v.device_type.as_deref()) == Some(chip)
        })
    };
    let spec = pod.spec.get_or_insert_default();
    if spec.runtime_class_name.is_none()
        && let Some(chip) = chips
            .clone()
            .find(|c| !c.runtime_class_name.is_empty() && asks_chip(&c.common_word))
    {
        spec.runtime_class_name = Some(chip.runtime_class_name.clone());
    }
    if !chips.clone().any(|c| c.overwrite_env) {
        return;
    }
    let asks_npus = |name: &str| wanted.iter().any(|r| r.name == name && mine(r));
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for container in containers {
        if asks_npus(&container.name) {
            continue;
        }
        let env = container.env.get_or_insert_default();
        if !env.iter().any(|e| e.name == VISIBLE_DEVICES) {
            env.push(EnvVar {
                name: VISIBLE_DEVICES.into(),
                value: Some(String::new()),
                value_from: None,
            });
        }
    }
}
