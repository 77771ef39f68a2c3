//! The DRA front door: the node's GPUs offered as Dynamic Resource
//! Allocation devices, shared by claims that consume part of their capacity,
//! and recorded in the same ledger as the device plugin's pods.
//!
//! - [`slice`]: the node's ResourceSlice, from the offer; [`publish`] keeps
//!   it in the cluster while the node serves through DRA ([`crate::door`]).
//! - [`prepare`]: what a prepared claim gives its containers, as CDI specs.
//! - [`mirror`]: the VgpuAllocation that records a prepared claim.
//! - [`service`]: NodePrepareResources / NodeUnprepareResources.
//! - [`server`]: the kubelet plugin's sockets and registration.
//! - [`discovery`]: whether the cluster serves DRA at all; nothing above
//!   runs where it does not.

pub mod discovery;
pub mod mirror;
pub mod prepare;
pub mod publish;
pub mod server;
pub mod service;
pub mod slice;

pub use crate::claims::allocated_from;
pub use discovery::dra_served;
pub use mirror::{mirror, mirror_name};
pub use prepare::{ClaimGpu, cdi_spec, claim_gpus, prepared_devices};
pub use slice::{device_name, published_devices, resource_slice};

pub use tessera_api::names::dra::{CDI_KIND, DRIVER};
