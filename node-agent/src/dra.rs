//! The DRA front door (issue 16, in progress): the node's GPUs offered as
//! Dynamic Resource Allocation devices, shared by claims that consume part
//! of their capacity, and served from the same ledger as the device plugin.
//!
//! - [`slice`]: the node's ResourceSlice, from the offer.
//! - [`prepare`]: what a prepared claim gives its containers, as a CDI spec.
//!
//! Not yet wired into the agent: no slice is published and no DRA plugin is
//! registered with the kubelet.

pub mod prepare;
pub mod slice;

pub use prepare::{ClaimGpu, cdi_spec, claim_gpus};
pub use slice::resource_slice;

/// The DRA driver name Tessera's agents publish and prepare devices as.
pub const DRIVER: &str = "gpu.tessera.dev";

/// The CDI kind (`vendor/class`) of the devices the DRA door prepares.
pub const CDI_KIND: &str = "tessera.dev/vgpu";

/// The device name of GPU `index` in the node's pool (a DNS label).
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}
