//! The kubelet's Dynamic Resource Allocation plugin API, `v1`, and the
//! plugin registration API, `v1`, as tonic clients and servers.
//!
//! The protos are vendored unchanged from `k8s.io/kubelet` v0.36.3
//! (`pkg/apis/dra/v1/api.proto` and `pkg/apis/pluginregistration/v1/api.proto`,
//! Apache-2.0, see `proto/LICENSE`). The gRPC paths are the kubelet's:
//! `/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`,
//! `/pluginregistration.Registration/GetInfo` and so on.
//!
//! A DRA driver serves both on unix sockets: the registration service in
//! the kubelet's plugin registry ([`PLUGINS_REGISTRY`]), where the kubelet's
//! plugin watcher finds it and asks [`pluginregistration::registration_server::Registration::get_info`],
//! and the DRA service at the endpoint that answer names. The kubelet's
//! registration client sends an `:authority` tonic refuses; serve the
//! registration service through [`authority::relay`].

#![forbid(unsafe_code)]

pub mod authority;

/// The DRA plugin service: NodePrepareResources, NodeUnprepareResources.
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod dra {
    /// Version 1 (`k8s.io.kubelet.pkg.apis.dra.v1`).
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
}

/// The kubelet's plugin registration service (package `pluginregistration`,
/// version 1).
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// Where the kubelet's plugin watcher looks for registration sockets.
pub const PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry/";
/// The plugin type a DRA driver registers as (`PluginInfo.type`).
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// The service version a driver of the `v1` DRA API lists in
/// `PluginInfo.supported_versions`.
pub const DRA_PLUGIN_SERVICE_V1: &str = "v1.DRAPlugin";
