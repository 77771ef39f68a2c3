//! What HAMi's webhook writes for Iluvatar containers (`MutateAdmission`).

use k8s_openapi::{
    api::core::v1::{Container, EnvVar},
    apimachinery::pkg::api::resource::Quantity,
};
use tessera_api::names::iluvatar::CONTAINER_NAME_ENV;

use crate::request::types::ContainerRequest;
use crate::request::vendors::IluvatarConfig;

/// 100 × count cores when the container asks for more than one GPU, and
/// its name in `SOL_CONTINER_NAME` (read by the vendor's runtime) unless
/// it sets it.
pub(super) fn container(
    chip: &IluvatarConfig,
    container: &mut Container,
    wanted: &ContainerRequest,
) {
    if wanted.count > 1 && !chip.resource_core_name.is_empty() {
        let cores = Quantity((100 * u64::from(wanted.count)).to_string());
        let resources = container.resources.get_or_insert_default();
        resources
            .limits
            .get_or_insert_default()
            .insert(chip.resource_core_name.clone(), cores.clone());
        if let Some(requests) = resources.requests.as_mut() {
            requests.insert(chip.resource_core_name.clone(), cores);
        }
    }
    let env = container.env.get_or_insert_default();
    if !env.iter().any(|e| e.name == CONTAINER_NAME_ENV) {
        env.push(EnvVar {
            name: CONTAINER_NAME_ENV.into(),
            value: Some(container.name.clone()),
            value_from: None,
        });
    }
}
