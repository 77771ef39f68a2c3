//! Static MIG with `migStrategy: mixed`, as NVIDIA's device plugin serves
//! it: each MIG profile present on the node's GPUs is an extended resource
//! of its own (`nvidia.com/mig-3g.20gb`), served by a device plugin of its
//! own whose devices are the instances (ID = MIG UUID). The operator makes
//! the instances (nvidia-mig-parted); the default scheduler places pods on
//! the Node's allocatable count, and Allocate hands out the instance UUIDs
//! the kubelet chose, with no interposer (the hardware isolates them).
//!
//! The GPUs themselves offer no `nvidia.com/gpu` slice in this mode
//! (`settings::offered`), so the ledger never books what these plugins hand
//! out.

use std::{collections::BTreeMap, path::PathBuf};

use tessera_api::{
    mig,
    v1alpha1::{DeviceHealth, GpuDevice},
};
use tessera_deviceplugin::{
    HEALTHY, UNHEALTHY,
    v1beta1::{
        AllocateRequest, AllocateResponse, Device, DevicePluginOptions, Empty, NumaNode,
        PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
        PreferredAllocationResponse, TopologyInfo, device_plugin_server::DevicePlugin,
    },
};
use tokio::{sync::watch, task::JoinHandle};
use tonic::{Request, Response, Status};

use super::{DeviceList, Endpoint, Plugin};
use crate::{offer::Offer, readiness::PluginState, sharing::Mode};

/// One static instance as the kubelet sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticInstance {
    /// The MIG UUID (the device ID).
    pub uuid: String,
    /// The parent GPU's health.
    pub healthy: bool,
    /// The parent GPU's NUMA node.
    pub numa_node: Option<u32>,
}

/// The GPUs whose MIG instances are served statically, one plugin per
/// profile: all of them on a static-MIG node, none otherwise.
pub fn static_gpus(offer: &Offer) -> impl Iterator<Item = &GpuDevice> {
    let on = Mode::of(&offer.resolved.settings).serves_static_instances();
    offer.devices.iter().filter(move |_| on)
}

/// The static instances the node offers, by resource name: every instance
/// on a [`static_gpus`] GPU.
pub fn static_instances(offer: &Offer) -> BTreeMap<String, Vec<StaticInstance>> {
    let mut by_resource: BTreeMap<String, Vec<StaticInstance>> = BTreeMap::new();
    for gpu in static_gpus(offer) {
        for instance in &gpu.mig_instances {
            by_resource
                .entry(mig::resource_name(&instance.profile))
                .or_default()
                .push(StaticInstance {
                    uuid: instance.uuid.clone(),
                    healthy: gpu.health == DeviceHealth::Healthy,
                    numa_node: gpu.numa_node,
                });
        }
    }
    by_resource
}

/// The device plugin of one MIG profile's resource.
#[derive(Clone)]
pub struct StaticMigService {
    resource: String,
    offers: watch::Receiver<Offer>,
    list: DeviceList,
}

impl StaticMigService {
    /// Serves `resource`'s instances as `offers` lists them.
    pub fn new(resource: String, offers: watch::Receiver<Offer>, list: DeviceList) -> Self {
        Self {
            resource,
            offers,
            list,
        }
    }

    fn instances(&self) -> Vec<StaticInstance> {
        static_instances(&self.offers.borrow())
            .remove(&self.resource)
            .unwrap_or_default()
    }
}

fn devices(instances: &[StaticInstance]) -> Vec<Device> {
    instances
        .iter()
        .map(|i| Device {
            id: i.uuid.clone(),
            health: if i.healthy { HEALTHY } else { UNHEALTHY }.to_owned(),
            topology: i.numa_node.map(|n| TopologyInfo {
                nodes: vec![NumaNode { id: i64::from(n) }],
            }),
        })
        .collect()
}

impl Plugin for StaticMigService {
    fn options(&self) -> DevicePluginOptions {
        DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: false,
        }
    }
}

#[tonic::async_trait]
impl DevicePlugin for StaticMigService {
    type ListAndWatchStream = super::DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(Plugin::options(self)))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let resource = self.resource.clone();
        let stream = super::device_stream(self.offers.clone(), move |offer| {
            devices(
                &static_instances(offer)
                    .remove(&resource)
                    .unwrap_or_default(),
            )
        });
        Ok(Response::new(stream))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented(
            "static MIG resources have no preferred allocation",
        ))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let offered = self.instances();
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            let ids = &container.devices_ids;
            if let Some(unknown) = ids
                .iter()
                .find(|id| !offered.iter().any(|i| i.uuid == **id))
            {
                tracing::warn!(resource = %self.resource, device = %unknown, "Allocate refused: not an instance of this resource");
                return Err(Status::failed_precondition(format!(
                    "{}: {unknown} is not one of this node's instances of that profile (they are: {}); the instance was destroyed or its GPU left migStrategy mixed",
                    self.resource,
                    offered
                        .iter()
                        .map(|i| i.uuid.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            tracing::info!(resource = %self.resource, devices = %ids.join(","), "served Allocate (static MIG)");
            // No pod is named here: the first instance keys the annotation.
            let key = ids.first().cloned().unwrap_or_default();
            container_responses.push(super::allocate::answer(
                crate::sharing::static_mig::contract(ids),
                &self.list,
                &key,
            ));
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Runs one device plugin per MIG profile present under `migStrategy:
/// mixed`, starting and stopping them as the profiles on the node change,
/// while polled (the plugins stop with it); returns when the offers end.
pub async fn serve_profiles(dir: PathBuf, mut offers: watch::Receiver<Offer>, list: DeviceList) {
    /// The plugins served, stopped when dropped.
    #[derive(Default)]
    struct Running(BTreeMap<String, JoinHandle<()>>);
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.values().for_each(JoinHandle::abort);
        }
    }
    let mut running = Running::default();
    loop {
        let wanted = static_instances(&offers.borrow());
        let gone: Vec<String> = running
            .0
            .keys()
            .filter(|r| !wanted.contains_key(*r))
            .cloned()
            .collect();
        for resource in gone {
            if let Some(plugin) = running.0.remove(&resource) {
                plugin.abort();
            }
            let endpoint = Endpoint {
                dir: dir.clone(),
                resource: resource.clone(),
            };
            let _ = std::fs::remove_file(dir.join(endpoint.socket_name()));
            tracing::info!(%resource, "static MIG resource gone: its device plugin stopped");
        }
        for resource in wanted.into_keys() {
            if running.0.contains_key(&resource) {
                continue;
            }
            let endpoint = Endpoint {
                dir: dir.clone(),
                resource: resource.clone(),
            };
            let service = StaticMigService::new(resource.clone(), offers.clone(), list.clone());
            // Readiness follows the main plugin; this state is not read.
            let (state, _) = watch::channel(PluginState::NotRegistered);
            tracing::info!(%resource, "serving a static MIG resource");
            running
                .0
                .insert(resource, tokio::spawn(super::run(endpoint, service, state)));
        }
        if offers.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
