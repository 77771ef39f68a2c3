//! What HAMi's webhook writes for Kunlunxin containers (`MutateAdmission`
//! in `vdevice.go`).

use k8s_openapi::{api::core::v1::Container, apimachinery::pkg::api::resource::Quantity};
use tessera_api::names::kunlun::VXPU_TYPE;

use crate::request::types::ContainerRequest;
use crate::request::vendors::KunlunConfig;

/// For a vXPU container that names its memory: the memory rounded up to
/// the vXPU size, in limits and requests, so the kubelet accounts what the
/// plugin hands out.
pub(super) fn container(xpu: &KunlunConfig, container: &mut Container, wanted: &ContainerRequest) {
    let vxpu = wanted
        .vendor
        .as_ref()
        .and_then(|v| v.device_type.as_deref())
        == Some(VXPU_TYPE);
    let resources = container.resources.get_or_insert_default();
    let key = &xpu.resource_vmemory_name;
    let named = resources
        .limits
        .as_ref()
        .is_some_and(|l| l.contains_key(key));
    if !vxpu || !named {
        return;
    }
    let size = Quantity(wanted.memory.resolve(0).to_string());
    resources
        .limits
        .get_or_insert_default()
        .insert(key.clone(), size.clone());
    resources
        .requests
        .get_or_insert_default()
        .insert(key.clone(), size);
}
