//! Tessera's control plane.
//!
//! - [`engine`]: pure placement logic (fit, device choice, scores, reasons).
//! - [`cache`]: the watches, one per kind, shared by everything below.
//! - [`projection`]: GpuNodes and VgpuAllocations folded into a per-node ledger.
//! - [`extender`]: the kube-scheduler extender (filter, prioritize, bind).
//! - [`webhook`]: the mutating admission webhook for GPU pods.
//! - [`lifecycle`]: releases allocations and locks, reports GpuNodeConfig status.
//! - [`config`]: cluster-wide settings.

#![forbid(unsafe_code)]

pub mod app;
pub mod cache;
pub mod config;
pub use tessera_scheduling::engine;
mod error;
pub mod extender;
pub mod leader;
pub mod lean_pod;
pub mod lifecycle;
pub mod lifecycle_rules;
pub mod metrics;
pub mod projection;
pub mod telemetry;
pub mod tuning;
pub mod vendors;
pub mod webhook;

pub use error::Error;

/// The controller's field manager: every status it writes is applied
/// (server-side) under this name.
pub const FIELD_MANAGER: &str = "tessera-controller";

/// Writes status by server-side apply as [`FIELD_MANAGER`].
pub(crate) const STATUS: tessera_kubekit::StatusWriter =
    tessera_kubekit::StatusWriter::new(FIELD_MANAGER);
