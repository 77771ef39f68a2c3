//! The kubelet device plugin: pure decisions (which pod and container an
//! Allocate serves, device IDs, how the devices reach the container
//! runtime), the gRPC service and its registration.
mod allocate;
mod device_list;
mod ids;
pub mod lock_checks;
pub mod modes;
pub mod served;
mod server;
mod service;
pub mod static_mig;

pub use crate::contract::{
    CONTAINER_LIBRARY, CONTAINER_PRELOAD, CONTAINER_REGION_DIR, HostPaths, MountSpec, REGION_FILE,
    interposer_mounts, slice_env,
};
pub use crate::readiness::PluginState;
pub use allocate::{AllocateError, Grant, answer, grant, preferred};
pub use device_list::{
    CDI_ANNOTATION_PLUGIN, DEFAULT_CDI_ANNOTATION_PREFIX, DEFAULT_CDI_KIND, DeviceList,
    DeviceListStrategy, Listed, parse_cdi_annotation_prefix, parse_cdi_kind,
};
pub use ids::{device_list, replica_id, uuid_of};
pub use modes::Modes;
pub use server::{DeviceStream, Endpoint, Plugin, device_stream, run};
pub use service::{Service, options};

#[cfg(test)]
pub(crate) fn test_lock(
    node: &str,
    holder: &tessera_api::v1alpha1::PodReference,
    allocation: &str,
) -> tessera_api::v1alpha1::NodeLock {
    let acquired = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let mut lock = tessera_api::testing::node_lock(node, holder.clone(), allocation, acquired, 60);
    lock.metadata.uid = Some(format!("lock-{}", holder.uid));
    lock
}
