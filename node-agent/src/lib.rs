//! Tessera's node agent.
//!
//! - [`backend`]: the node's GPUs from NVML or from a file of fake GPUs.
//! - [`offer`]: what the node offers (its devices under its settings).
//! - [`holders`]: who holds what, read from the node's allocations.
//! - [`contract`]: what a container gets for the interposer, through either door.
//! - [`readiness`]: whether the kubelet can use the device plugin now.
//! - [`settings`]: the node's settings (GpuNodeConfig) applied to them.
//! - [`sharing`]: the sharing modes: how each offers a GPU and serves a container.
//! - [`door`]: the node's front door (device plugin or DRA) and when it may switch.
//! - [`dra`]: the DRA front door: ResourceSlice, kubelet DRA plugin, claim mirrors.
//! - [`inventory`]: what the node offers, kept current.
//! - [`install`]: the interposer copied from the image onto the host.
//! - [`mig`]: dynamic MIG instances created at Allocate, destroyed at release.
//! - [`mps`]: one MPS control daemon per GPU in MPS mode.
//! - [`monitor`]: Prometheus metrics per GPU and per container.
//! - [`publish`]: the node's GpuNode.
//! - [`lease`]: the agent's liveness Lease.
//! - [`ledger`]: allocations the agent records itself (DRA claims, static MIG holders).
//! - [`plugin`]: the kubelet device plugin (ListAndWatch, Allocate, ...).
//! - [`static_holders`]: the pods holding static MIG instances, from the kubelet, in the ledger.
//! - [`view`]: node-scoped watches and Allocate's reads.

#![forbid(unsafe_code)]
pub mod app;
pub mod backend;
mod claims;
pub mod contract;
pub mod door;
pub mod dra;
mod error;
pub mod holders;
pub mod install;
pub mod inventory;
pub mod lease;
pub mod ledger;
pub mod mig;
pub mod monitor;
pub mod mps;
pub mod offer;
mod owner;
mod periodic;
pub mod plugin;
pub mod publish;
pub mod readiness;
pub mod settings;
pub mod sharing;
mod socket;
pub mod static_holders;
pub mod supervise;
pub mod view;

pub use error::Error;

/// The node agent's field manager: every status it writes is applied
/// (server-side) under this name.
pub const FIELD_MANAGER: &str = tessera_api::names::NODE_AGENT_FIELD_MANAGER;

/// Now, in whole seconds, as the API server stores timestamps (so a
/// timestamp read back compares equal to the one written).
pub(crate) fn whole_seconds_now() -> k8s_openapi::jiff::Timestamp {
    use k8s_openapi::jiff::Timestamp;
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default()
}

/// Writes status by server-side apply as [`FIELD_MANAGER`].
pub(crate) const STATUS: tessera_kubekit::StatusWriter =
    tessera_kubekit::StatusWriter::new(FIELD_MANAGER);
