//! Serving the DRA plugin to the kubelet: the DRA service on a socket in
//! the kubelet's plugins directory, and the registration service on a
//! socket in its plugin registry, where the kubelet's plugin watcher finds
//! it (at once through inotify, and again when the kubelet restarts), asks
//! GetInfo for the DRA socket and tells the outcome in
//! NotifyRegistrationStatus.
//!
//! The sockets are served again whenever one is removed or the server
//! stops, so the kubelet always finds a live plugin.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tessera_draplugin::{
    DRA_PLUGIN_SERVICE_V1, DRA_PLUGIN_TYPE,
    dra::v1::dra_plugin_server::DraPluginServer,
    pluginregistration::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
        registration_server::{Registration, RegistrationServer},
    },
};
use tokio::io::DuplexStream;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use super::{DRIVER, service::DraService};
use crate::{Error, socket::identity};

/// Where the plugin's sockets go, as the kubelet sees them.
#[derive(Clone, Debug)]
pub struct Sockets {
    /// The kubelet's plugins directory (`/var/lib/kubelet/plugins`); the
    /// DRA service listens on `<dir>/gpu.tessera.dev/dra.sock`.
    pub plugins_dir: PathBuf,
    /// The kubelet's plugin registry (`/var/lib/kubelet/plugins_registry`);
    /// the registration service listens on `<dir>/gpu.tessera.dev-reg.sock`.
    pub registry_dir: PathBuf,
}

impl Sockets {
    /// The DRA service's socket.
    pub fn endpoint(&self) -> PathBuf {
        self.plugins_dir.join(DRIVER).join("dra.sock")
    }

    /// The registration service's socket.
    pub fn registration(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER}-reg.sock"))
    }
}

/// The registration service: names the DRA socket and listens to the outcome.
#[derive(Clone)]
struct Registrar {
    endpoint: String,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![DRA_PLUGIN_SERVICE_V1.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER, "the kubelet registered the DRA plugin");
        } else {
            tracing::error!(driver = DRIVER, error = %status.error, "the kubelet refused the DRA plugin");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// How often the sockets are checked.
const CHECK: Duration = Duration::from_secs(1);

/// Serves `service` and its registration until the process stops.
pub async fn run(sockets: Sockets, service: DraService) {
    loop {
        if let Err(error) = serve_once(&sockets, service.clone()).await {
            tracing::warn!(%error, "the DRA plugin stopped; serving it again");
        }
        tokio::time::sleep(CHECK).await;
    }
}

fn listen(socket: &Path) -> Result<tokio::net::UnixListener, Error> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    }
    let _ = std::fs::remove_file(socket);
    tokio::net::UnixListener::bind(socket)
        .map_err(Error::io(format!("listening on {}", socket.display())))
}

async fn serve_once(sockets: &Sockets, service: DraService) -> Result<(), Error> {
    let endpoint = sockets.endpoint();
    let registration = sockets.registration();
    // Both sockets before anything is spawned (a failure leaves nothing
    // running); the DRA socket first: the kubelet connects to it as soon as
    // the registration socket appears.
    let dra = listen(&endpoint)?;
    let reg = listen(&registration)?;
    let mut dra_server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DraPluginServer::new(service))
            .serve_with_incoming(UnixListenerStream::new(dra)),
    );
    let registrar = Registrar {
        endpoint: endpoint.display().to_string(),
    };
    // Each kubelet connection reaches the server through the relay that
    // makes its `:authority` one tonic accepts.
    let (connections, incoming) = tokio::sync::mpsc::channel::<std::io::Result<DuplexStream>>(4);
    let mut reg_server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(registrar))
            .serve_with_incoming(ReceiverStream::new(incoming)),
    );
    let mut relaying = tokio::spawn(async move {
        loop {
            let kubelet = match reg.accept().await {
                Ok((kubelet, _)) => kubelet,
                // Out of file descriptors, for instance: wait, keep serving.
                Err(error) => {
                    tracing::warn!(%error, "accepting on the registration socket failed");
                    tokio::time::sleep(CHECK).await;
                    continue;
                }
            };
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            if connections.send(Ok(theirs)).await.is_err() {
                return;
            }
            tokio::spawn(async move {
                if let Err(error) = tessera_draplugin::authority::relay(kubelet, ours).await {
                    tracing::debug!(%error, "a registration connection ended");
                }
            });
        }
    });
    let served = (identity(&endpoint), identity(&registration));
    tracing::info!(endpoint = %endpoint.display(), registration = %registration.display(), "serving the DRA plugin");
    let result = loop {
        tokio::select! {
            finished = &mut dra_server => break Err(format!("the DRA server exited: {finished:?}")),
            finished = &mut reg_server => break Err(format!("the registration server exited: {finished:?}")),
            finished = &mut relaying => break Err(format!("the registration relay exited: {finished:?}")),
            () = tokio::time::sleep(CHECK) => {}
        }
        if (identity(&endpoint), identity(&registration)) != served {
            tracing::info!("a DRA plugin socket was removed or replaced; serving again");
            break Ok(());
        }
    };
    dra_server.abort();
    reg_server.abort();
    relaying.abort();
    result.map_err(|e| Error::io("serving the DRA plugin")(std::io::Error::other(e)))
}
