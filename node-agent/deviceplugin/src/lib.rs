//! The kubelet's device-plugin API, `v1beta1`, and its pod-resources API,
//! `v1`, as tonic clients and servers.
//!
//! The protos are vendored unchanged from `k8s.io/kubelet` v0.36.3
//! (`pkg/apis/deviceplugin/v1beta1/api.proto` and
//! `pkg/apis/podresources/v1/api.proto`, Apache-2.0, see `proto/LICENSE`);
//! the gRPC paths are `/v1beta1.Registration/Register`,
//! `/v1beta1.DevicePlugin/Allocate`, `/v1.PodResourcesLister/List` and so
//! on, exactly as the kubelet serves and calls them.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// Generated messages, clients and servers.
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The kubelet's pod-resources API: which devices each pod's containers
/// were allocated, by resource name (`List`), on the socket
/// [`POD_RESOURCES_SOCKET`].
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod podresources {
    /// Version `v1` (GA since Kubernetes 1.28).
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// The kubelet's pod-resources socket (`<root-dir>/pod-resources/kubelet.sock`).
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

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
