//! Serving the plugin on its unix socket and registering with the kubelet,
//! again and again: after a kubelet restart (kubelet.sock re-created, our
//! socket removed) and whenever the server itself stops.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tessera_deviceplugin::{
    KUBELET_SOCKET, VERSION, connect_unix,
    v1beta1::{
        Device, DevicePluginOptions, ListAndWatchResponse, RegisterRequest,
        device_plugin_server::{DevicePlugin, DevicePluginServer},
        registration_client::RegistrationClient,
    },
};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

use crate::{Error, offer::Offer, readiness::PluginState};

/// The stream ListAndWatch answers with.
pub type DeviceStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<ListAndWatchResponse, tonic::Status>> + Send>,
>;

/// ListAndWatch over `offers`: the devices `list` makes of each offer, sent
/// whenever they differ from the last ones sent.
pub fn device_stream(
    offers: watch::Receiver<Offer>,
    list: impl Fn(&Offer) -> Vec<Device> + Send + 'static,
) -> DeviceStream {
    use futures::StreamExt;
    let mut last = None;
    Box::pin(
        tokio_stream::wrappers::WatchStream::new(offers).filter_map(move |offer| {
            let devices = list(&offer);
            let changed = last.as_ref() != Some(&devices);
            last = Some(devices.clone());
            async move { changed.then_some(Ok(ListAndWatchResponse { devices })) }
        }),
    )
}

/// A device-plugin service [`run`] can serve: the gRPC service and the
/// options it registers with.
pub trait Plugin: DevicePlugin + Clone {
    /// The options sent with the registration (and from
    /// `GetDevicePluginOptions`).
    fn options(&self) -> DevicePluginOptions;
}

/// How often the agent checks the kubelet's socket and its own (two
/// `stat`s). Short, because a restarted kubelet admits the pods already bound
/// to its node moments after re-creating kubelet.sock, and rejects GPU pods
/// until the plugin has registered again.
const CHECK: Duration = Duration::from_millis(50);

/// Where and as what the plugin registers.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The kubelet's device-plugin directory (holds kubelet.sock).
    pub dir: PathBuf,
    /// The extended resource, e.g. `nvidia.com/gpu`.
    pub resource: String,
}

impl Endpoint {
    /// The plugin's socket file name, derived from the resource name.
    pub fn socket_name(&self) -> String {
        format!("tessera-{}.sock", self.resource.replace(['/', '.'], "-"))
    }
}

use crate::socket::identity;

/// Serves `service` and keeps it registered with the kubelet until the
/// process stops, reporting registration through `state`.
pub async fn run<P: Plugin>(endpoint: Endpoint, service: P, state: watch::Sender<PluginState>) {
    let kubelet = endpoint.dir.join(KUBELET_SOCKET);
    let socket = endpoint.dir.join(endpoint.socket_name());
    loop {
        if let Err(error) = serve_once(&endpoint, &kubelet, &socket, service.clone(), &state).await
        {
            tracing::warn!(%error, "device plugin stopped; starting it again");
            tokio::time::sleep(CHECK).await;
        }
    }
}

/// Sets the state unless the agent is stopping.
fn report(state: &watch::Sender<PluginState>, now: PluginState) {
    state.send_if_modified(|current| {
        let changed = *current != PluginState::Stopping && *current != now;
        if changed {
            *current = now;
        }
        changed
    });
}

async fn serve_once<P: Plugin>(
    endpoint: &Endpoint,
    kubelet: &Path,
    socket: &Path,
    service: P,
    state: &watch::Sender<PluginState>,
) -> Result<(), Error> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)
        .map_err(Error::io(format!("listening on {}", socket.display())))?;
    let options = service.options();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    let result = async {
        // Register once the kubelet listens; remember which kubelet.sock we used.
        let registered = loop {
            // A starting kubelet empties the directory before it creates
            // kubelet.sock: our socket may be gone before we ever register.
            if identity(socket).is_none() {
                tracing::info!("our socket was removed before registration; serving again");
                return Ok(());
            }
            let seen = identity(kubelet);
            match register(endpoint, kubelet, options).await {
                Ok(()) => break seen,
                Err(error) => {
                    tracing::info!(%error, "kubelet not reachable yet; retrying registration");
                    tokio::time::sleep(CHECK).await;
                }
            }
            if server.is_finished() {
                return Err(Error::io("serving the device plugin")(std::io::Error::other(
                    "the gRPC server exited",
                )));
            }
        };
        tracing::info!(socket = %socket.display(), resource = %endpoint.resource, "registered with the kubelet");
        report(state, PluginState::Registered);
        loop {
            tokio::select! {
                finished = &mut server => {
                    return Err(Error::io("serving the device plugin")(std::io::Error::other(
                        format!("the gRPC server exited: {finished:?}"),
                    )));
                }
                () = tokio::time::sleep(CHECK) => {}
            }
            if identity(kubelet) != registered {
                tracing::info!("kubelet.sock changed (kubelet restarted); registering again");
                return Ok(());
            }
            if identity(socket).is_none() {
                tracing::info!("our socket was removed; serving and registering again");
                return Ok(());
            }
        }
    }
    .await;
    report(state, PluginState::NotRegistered);
    // Stop at once: a graceful stop would wait for the kubelet's open
    // ListAndWatch stream, which a restarted kubelet never closes.
    let _ = stop.send(());
    server.abort();
    result
}

async fn register(
    endpoint: &Endpoint,
    kubelet: &Path,
    options: DevicePluginOptions,
) -> Result<(), Error> {
    let channel = connect_unix(kubelet)
        .await
        .map_err(Error::grpc(format!("connecting to {}", kubelet.display())))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: VERSION.to_owned(),
            endpoint: endpoint.socket_name(),
            resource_name: endpoint.resource.clone(),
            options: Some(options),
        })
        .await
        .map_err(Error::grpc("registering with the kubelet"))?;
    Ok(())
}
