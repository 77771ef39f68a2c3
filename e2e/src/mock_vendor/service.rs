//! The mock plugin's kubelet side: the `v1beta1` DevicePlugin service on its
//! socket, registered with the kubelet again whenever `kubelet.sock` is new.

use std::{
    collections::HashMap, os::unix::fs::MetadataExt, path::Path, pin::Pin, sync::Arc,
    time::Duration,
};

use futures::Stream;
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tessera_deviceplugin::{
    HEALTHY, KUBELET_SOCKET, VERSION, connect_unix,
    v1beta1::{
        AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
        Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
        PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
        device_plugin_server::{DevicePlugin, DevicePluginServer},
        registration_client::RegistrationClient,
    },
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::{
    amd::{AllocateState, CU_ALLOCATED},
    cambricon, enflame, indexed,
    plugin::MockPlugin,
    pods::pending_on,
    protocol,
    types::{Registration, Vendor},
};
use crate::error::Error;

const CHECK: Duration = Duration::from_secs(1);

#[derive(Clone)]
struct Service {
    plugin: MockPlugin,
    client: Client,
    /// The resource this socket serves.
    registration: Registration,
    /// What one Allocate keeps for the next, shared by the plugin's
    /// sockets.
    kept: Arc<tokio::sync::Mutex<Kept>>,
}

/// What the plugin keeps between Allocate calls.
#[derive(Debug, Default)]
struct Kept {
    /// Cambricon's smlu answer for the pod's second call.
    smlu: cambricon::Pending,
    /// Enflame's DRS instances made.
    drs: enflame::Instances,
}

type Devices = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

/// Serves and registers every resource until the process stops; starts
/// over when the kubelet restarts or removes a socket.
pub(super) async fn serve(plugin: MockPlugin, client: Client) -> Result<(), Error> {
    let kubelet = plugin.plugin_dir.join(KUBELET_SOCKET);
    let kept = Arc::default();
    loop {
        let mut servers = Vec::new();
        let mut sockets = Vec::new();
        for registration in plugin.registrations() {
            let socket = plugin.plugin_dir.join(&registration.socket);
            let _ = std::fs::remove_file(&socket);
            let listener = tokio::net::UnixListener::bind(&socket)
                .map_err(Error::io("listening on", &socket))?;
            let service = Service {
                plugin: plugin.clone(),
                client: client.clone(),
                registration,
                kept: Arc::clone(&kept),
            };
            servers.push(tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(DevicePluginServer::new(service))
                    .serve_with_incoming(UnixListenerStream::new(listener)),
            ));
            sockets.push(socket);
        }
        let registered = loop {
            let seen = identity(&kubelet);
            if seen.is_some() && register_all(&plugin, &kubelet).await.is_ok() {
                break seen;
            }
            tokio::time::sleep(CHECK).await;
        };
        tracing::info!(resource = %plugin.resource(), "registered with the kubelet");
        while identity(&kubelet) == registered && sockets.iter().all(|s| identity(s).is_some()) {
            tokio::time::sleep(CHECK).await;
        }
        tracing::info!("kubelet restarted or socket removed; registering again");
        for server in servers {
            server.abort();
        }
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

async fn register_all(plugin: &MockPlugin, kubelet: &Path) -> Result<(), String> {
    for registration in plugin.registrations() {
        let channel = connect_unix(kubelet).await.map_err(|e| e.to_string())?;
        RegistrationClient::new(channel)
            .register(RegisterRequest {
                version: VERSION.to_owned(),
                endpoint: registration.socket,
                resource_name: registration.resource,
                options: Some(DevicePluginOptions::default()),
            })
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl Service {
    /// Allocate by the vendor's own protocol: Cambricon's dynamic smlu (one
    /// instance for the container, whichever of its resources the kubelet
    /// asks for) or Enflame's DRS (one container per call).
    async fn allocate_partition(
        &self,
        request: &AllocateRequest,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut kept = self.kept.lock().await;
        let envs = match &self.plugin.vendor {
            Vendor::EnflameDrs => match request.container_requests.as_slice() {
                [one] => {
                    enflame::allocate(
                        &self.client,
                        &self.plugin.node,
                        one.devices_ids.len(),
                        &mut kept.drs,
                    )
                    .await
                }
                _ => Err("internal error! the Allocate() method can only allocate resources for one container at a time currently".into()),
            },
            _ => {
                cambricon::allocate(
                    &self.client,
                    &self.plugin.node,
                    &self.plugin.devices,
                    &mut kept.smlu,
                )
                .await
            }
        }
        .map_err(|error| {
            tracing::warn!(resource = %self.registration.resource, error, "allocate failed");
            Status::internal(error)
        })?;
        tracing::info!(resource = %self.registration.resource, "allocated a partition");
        let container = ContainerAllocateResponse {
            envs: envs.into_iter().collect(),
            ..ContainerAllocateResponse::default()
        };
        Ok(Response::new(AllocateResponse {
            container_responses: vec![container; request.container_requests.len().max(1)],
        }))
    }

    /// Allocate of a plugin that reads the devices' indexes from one pod
    /// annotation (`indexed`): Moore Threads and AWS Neuron mark nothing
    /// but `NEURON_ALLOCATED`; Kunlunxin sets `bind-phase: success`.
    async fn allocate_indexed(
        &self,
        request: &AllocateRequest,
    ) -> Result<AllocateResponse, String> {
        let resource = self.registration.resource.as_str();
        let pods = pending_on(&self.client, &self.plugin.node).await?;
        let pod = match &self.plugin.vendor {
            Vendor::Mthreads => indexed::mthreads_pod(&pods, &self.plugin.node)?.clone(),
            Vendor::Neuron { .. } => indexed::neuron_pod(&pods, &self.plugin.node)?.clone(),
            _ => self.plugin.pending_pod(&self.client).await?,
        };
        let mut response = AllocateResponse::default();
        for wanted in &request.container_requests {
            let picked = wanted.devices_ids.len();
            let envs = match &self.plugin.vendor {
                Vendor::Mthreads => indexed::mthreads_env(&pod, resource, picked),
                Vendor::Neuron { .. } => indexed::neuron_env(&pod, resource, picked),
                _ => indexed::kunlunxin_env(&pod, picked),
            };
            let envs = match envs {
                Ok(envs) => envs,
                Err(error) => {
                    if self.plugin.vendor == Vendor::KunlunxinXpu {
                        self.plugin.finish(&self.client, &pod, "failed").await;
                    }
                    return Err(error);
                }
            };
            response
                .container_responses
                .push(ContainerAllocateResponse {
                    envs: envs.into_iter().collect(),
                    ..ContainerAllocateResponse::default()
                });
        }
        let pods: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        match &self.plugin.vendor {
            Vendor::Neuron { .. } => {
                let served = json!({"metadata": {"annotations": {
                    tessera_api::names::neuron::ALLOCATED_FLAG: "true"}}});
                pods.patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(served),
                )
                .await
                .map_err(|e| format!("mark the pod allocated: {e}"))?;
            }
            Vendor::KunlunxinXpu => self.plugin.finish(&self.client, &pod, "success").await,
            _ => {}
        }
        tracing::info!(pod = %pod.name_any(), resource, "allocated");
        Ok(response)
    }

    /// HAMi's plugin Allocate: one response per container request, each
    /// from the pod's next container entry.
    async fn allocate_for(
        &self,
        pod: &Pod,
        request: &AllocateRequest,
    ) -> Result<AllocateResponse, String> {
        let key = self.plugin.to_allocate();
        let annotations = pod.annotations();
        let value = annotations
            .get(&key)
            .ok_or_else(|| format!("annotation {key} not set"))?;
        let mut containers = protocol::decode(value)?;
        let mut state = match &self.plugin.vendor {
            Vendor::Amd { .. } => AllocateState::from_pods(
                &self.plugin.node_pods(&self.client).await?,
            )
            .map_err(|e| format!("rebuild CU allocation for node {}: {e}", self.plugin.node))?,
            _ => AllocateState::default(),
        };
        let mut response = AllocateResponse::default();
        for wanted in &request.container_requests {
            let (_, devices) =
                protocol::pop_next(&mut containers).ok_or("no pending device allocation found")?;
            if devices.len() != wanted.devices_ids.len() {
                return Err(format!(
                    "device number not matched: annotation has {}, request has {}",
                    devices.len(),
                    wanted.devices_ids.len()
                ));
            }
            let envs: HashMap<String, String> = self
                .plugin
                .env(&devices, annotations, &mut state)?
                .into_iter()
                .collect();
            response
                .container_responses
                .push(ContainerAllocateResponse {
                    envs,
                    ..ContainerAllocateResponse::default()
                });
        }
        let mut patch = serde_json::Map::new();
        patch.insert(key.clone(), protocol::encode(&containers).into());
        if let Some(cus) =
            state.pod_annotation(annotations.get(CU_ALLOCATED).map(String::as_str))?
        {
            // AMD: the units are committed only while the Node lock is the pod's.
            self.plugin.check_lock_owner(&self.client, pod).await?;
            patch.insert(CU_ALLOCATED.to_owned(), cus.into());
        }
        let erased = json!({"metadata": {"annotations": patch}});
        Api::<Pod>::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default())
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(erased),
            )
            .await
            .map_err(|e| format!("erase allocated containers annotation: {e}"))?;
        Ok(response)
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    type ListAndWatchStream = Devices;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions::default()))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let devices = self
            .registration
            .devices
            .iter()
            .map(|id| Device {
                id: id.clone(),
                health: HEALTHY.to_owned(),
                ..Device::default()
            })
            .collect();
        let first = futures::stream::once(async move { Ok(ListAndWatchResponse { devices }) });
        Ok(Response::new(Box::pin(futures::StreamExt::chain(
            first,
            futures::stream::pending(),
        ))))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Ok(Response::new(PreferredAllocationResponse::default()))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        match &self.plugin.vendor {
            Vendor::Cambricon | Vendor::EnflameDrs => {
                return self.allocate_partition(request.get_ref()).await;
            }
            Vendor::Mthreads | Vendor::Neuron { .. } | Vendor::KunlunxinXpu => {
                return self
                    .allocate_indexed(request.get_ref())
                    .await
                    .map(Response::new)
                    .map_err(|error| {
                        tracing::warn!(resource = %self.registration.resource, error, "allocate failed");
                        Status::internal(error)
                    });
            }
            _ => {}
        }
        let pod = self
            .plugin
            .pending_pod(&self.client)
            .await
            .map_err(|e| Status::internal(format!("get pending pod error: {e}")))?;
        match self.allocate_for(&pod, request.get_ref()).await {
            Ok(response) => {
                // HAMi's PodAllocationTrySuccess: success once every
                // container of this device type is served.
                let pods: Api<Pod> =
                    Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
                let refreshed = pods.get(&pod.name_any()).await.ok();
                let left = refreshed
                    .as_ref()
                    .and_then(|p| p.annotations().get(&self.plugin.to_allocate()).cloned())
                    .unwrap_or_default();
                if protocol::all_served(&left, self.plugin.device_type()) {
                    self.plugin.finish(&self.client, &pod, "success").await;
                }
                tracing::info!(pod = %pod.name_any(), "allocated");
                Ok(Response::new(response))
            }
            Err(error) => {
                tracing::warn!(pod = %pod.name_any(), error, "allocate failed");
                self.plugin.finish(&self.client, &pod, "failed").await;
                Err(Status::internal(error))
            }
        }
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse::default()))
    }
}

impl MockPlugin {
    /// Registers on the Node and serves the kubelet until the process stops.
    pub async fn run(self, client: Client) -> Result<(), Error> {
        let register = {
            let (plugin, client) = (self.clone(), client.clone());
            async move {
                loop {
                    if let Err(error) = plugin.register(&client).await {
                        tracing::warn!(%error, "register pass failed; retrying");
                    }
                    tokio::time::sleep(plugin.interval).await;
                }
            }
        };
        tokio::select! {
            () = register => Ok(()),
            result = serve(self, client) => result,
        }
    }

    async fn register(&self, client: &Client) -> Result<(), Error> {
        let annotations = self.register_annotations(Timestamp::now());
        if annotations.is_empty() {
            return Ok(());
        }
        Api::<Node>::all(client.clone())
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await?;
        Ok(())
    }
}
