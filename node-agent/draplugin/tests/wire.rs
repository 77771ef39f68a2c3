//! The generated services answer on the kubelet's gRPC paths over unix
//! sockets, as the kubelet's plugin watcher and DRA manager call them: the
//! registration service first (GetInfo, then NotifyRegistrationStatus), then
//! the DRA service at the endpoint GetInfo named.

use std::{collections::HashMap, sync::Arc};

use tessera_draplugin::{
    DRA_PLUGIN_SERVICE_V1, DRA_PLUGIN_TYPE,
    dra::v1::{
        Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
        NodePrepareResourcesResponse, NodeUnprepareResourcesRequest,
        NodeUnprepareResourcesResponse,
        dra_plugin_client::DraPluginClient,
        dra_plugin_server::{self, DraPlugin, DraPluginServer},
    },
    pluginregistration::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
        registration_client::RegistrationClient,
        registration_server::{self, Registration, RegistrationServer},
    },
};
use tokio::sync::Mutex;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// A registration service that remembers what the kubelet told it.
#[derive(Clone, Default)]
struct Registrar {
    endpoint: String,
    told: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: "gpu.tessera.dev".into(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![DRA_PLUGIN_SERVICE_V1.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.told.lock().await.push(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A DRA service that prepares one device per claim.
#[derive(Clone, Default)]
struct Driver;

#[tonic::async_trait]
impl DraPlugin for Driver {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let prepared = NodePrepareResourceResponse {
                    devices: vec![Device {
                        request_names: vec!["gpu".into()],
                        pool_name: "node-a".into(),
                        device_name: "gpu-0".into(),
                        cdi_device_ids: vec![format!("tessera.dev/vgpu={}", c.uid)],
                        share_id: Some(c.uid.clone()),
                    }],
                    error: String::new(),
                };
                (c.uid, prepared)
            })
            .collect();
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, Default::default()))
            .collect::<HashMap<_, _>>();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

#[test]
fn the_services_have_the_kubelets_names() {
    assert_eq!(
        dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
}

#[tokio::test]
async fn a_kubelet_registers_the_driver_and_prepares_a_claim_over_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("gpu.tessera.dev-reg.sock");
    let endpoint = dir.path().join("dra.sock");
    let registrar = Registrar {
        endpoint: endpoint.display().to_string(),
        ..Registrar::default()
    };
    let serve = |path: &std::path::Path| {
        UnixListenerStream::new(tokio::net::UnixListener::bind(path).unwrap())
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(registrar.clone()))
            .serve_with_incoming(serve(&registry)),
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DraPluginServer::new(Driver))
            .serve_with_incoming(serve(&endpoint)),
    );

    // The plugin watcher: GetInfo, then the verdict.
    let channel = tessera_deviceplugin::connect_unix(&registry).await.unwrap();
    let mut kubelet = RegistrationClient::new(channel);
    let info = kubelet.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    kubelet
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert!(registrar.told.lock().await[0].plugin_registered);

    // The DRA manager, at the endpoint the driver named.
    let channel = tessera_deviceplugin::connect_unix(std::path::Path::new(&info.endpoint))
        .await
        .unwrap();
    let mut manager = DraPluginClient::new(channel);
    let claim = Claim {
        namespace: "ml".into(),
        uid: "uid-1".into(),
        name: "train-gpu".into(),
    };
    let prepared = manager
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    let devices = &prepared.claims["uid-1"].devices;
    assert_eq!(devices[0].cdi_device_ids, ["tessera.dev/vgpu=uid-1"]);
    assert_eq!(devices[0].share_id.as_deref(), Some("uid-1"));
    let unprepared = manager
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unprepared.claims["uid-1"].error, "");
}
