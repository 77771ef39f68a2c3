//! What the node offers: its devices under its resolved settings (kept
//! current by [`crate::inventory`]).

use tessera_api::{node_config::Resolved, v1alpha1::GpuDevice};

/// The node's offer: settings, where they came from, and the devices.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    /// The resolved settings and applied configs.
    pub resolved: Resolved,
    /// The devices under those settings.
    pub devices: Vec<GpuDevice>,
}
