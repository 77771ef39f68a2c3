//! Tessera's API: what pods, controllers, node agents and the interposer agree on.
//!
//! - [`names`] and [`env`]: resource names, annotation keys and the interposer's
//!   environment contract. They have no dependencies, so the interposer builds
//!   this crate with `default-features = false` and gets only these.
//! - [`v1alpha1`]: the custom resources (`GpuNode`, `VgpuAllocation`, `NodeLock`,
//!   `GpuNodeConfig`) in group `tessera.dev`.
//! - [`quantity`]: Kubernetes quantities as whole numbers. (A pod's GPU
//!   request is read by `tessera-scheduling`'s `request`, with HAMi's rules.)
//! - [`mig`]: MIG profile tables and placement rules, shared by the
//!   scheduler and the node agent.
//! - [`node_config`]: which GpuNodeConfigs select a node and the settings that result.
//! - [`crds`]: the CustomResourceDefinitions generated from the types.
//! - `testing` (feature `testing`): builders for the custom resources in
//!   tests and benchmarks.

#![forbid(unsafe_code)]

#[cfg(feature = "kube")]
pub mod cordon;
pub mod env;
mod error;
pub mod names;

#[cfg(feature = "kube")]
pub mod crds;
#[cfg(feature = "kube")]
pub mod mig;
#[cfg(feature = "kube")]
pub mod node_config;
#[cfg(feature = "kube")]
pub mod quantity;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(feature = "kube")]
pub mod v1alpha1;

pub use error::{Error, Violation, Violations};

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
