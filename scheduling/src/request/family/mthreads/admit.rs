//! What HAMi's webhook writes for Moore Threads pods (`MutateAdmission`).

use k8s_openapi::{
    api::core::v1::{Container, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use tessera_api::names::mthreads::{CORES_PER_CARD, REQUEST_GPU_NUM, WHOLE_CARD_UNITS};

use crate::request::types::ContainerRequest;
use crate::request::vendors::MthreadsConfig;

/// For a container that asks for whole cards (more than one, or no
/// memory): 16 cores and 96 memory units per card.
pub(super) fn container(mt: &MthreadsConfig, container: &mut Container, wanted: &ContainerRequest) {
    let resources = container.resources.get_or_insert_default();
    let named = |key: &str| {
        resources
            .limits
            .as_ref()
            .is_some_and(|l| l.contains_key(key))
            || resources
                .requests
                .as_ref()
                .is_some_and(|r| r.contains_key(key))
    };
    if wanted.count == 1 && named(&mt.resource_memory_name) {
        return;
    }
    let count = u64::from(wanted.count);
    let limits = resources.limits.get_or_insert_default();
    limits.insert(
        mt.resource_core_name.clone(),
        Quantity((count * u64::from(CORES_PER_CARD)).to_string()),
    );
    limits.insert(
        mt.resource_memory_name.clone(),
        Quantity((count * WHOLE_CARD_UNITS).to_string()),
    );
}

/// `mthreads.com/request-gpu-num` for a container asking for more than one
/// GPU, among those `mine` selects.
pub(super) fn pod(
    pod: &mut Pod,
    wanted: &[ContainerRequest],
    mine: impl Fn(&ContainerRequest) -> bool,
) {
    if let Some(many) = wanted.iter().find(|r| mine(r) && r.count > 1) {
        pod.metadata
            .annotations
            .get_or_insert_default()
            .insert(REQUEST_GPU_NUM.to_owned(), many.count.to_string());
    }
}
