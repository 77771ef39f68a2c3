//! The kubelet device-plugin API, `v1beta1`, as tonic clients and servers.
//!
//! The proto is vendored unchanged from `k8s.io/kubelet` v0.36.3
//! (`pkg/apis/deviceplugin/v1beta1/api.proto`, Apache-2.0, see
//! `proto/LICENSE`); the gRPC paths are `/v1beta1.Registration/Register`,
//! `/v1beta1.DevicePlugin/Allocate` and so on, exactly as the kubelet calls them.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// Generated messages, clients and servers.
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The API version a plugin registers with.
pub const VERSION: &str = "v1beta1";
/// Where the kubelet keeps its socket and the plugins' sockets.
pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins/";
/// The kubelet's registration socket, relative to [`DEVICE_PLUGIN_PATH`].
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// A healthy device.
pub const HEALTHY: &str = "Healthy";
/// An unhealthy device.
pub const UNHEALTHY: &str = "Unhealthy";

/// A gRPC channel over the unix socket at `path` (the URI is a placeholder
/// that tonic requires; every connection goes to the socket).
pub async fn connect_unix(
    path: &Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    tonic::transport::Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}
