//! Tessera's control plane.
//!
//! - [`engine`]: pure placement logic (fit, device choice, scores, reasons).
//! - [`cache`]: the watches, one per kind, shared by everything below.
//! - [`projection`]: GpuNodes and VgpuAllocations folded into a per-node ledger.
//! - [`extender`]: the kube-scheduler extender (filter, prioritize, bind).
//! - [`webhook`]: the mutating admission webhook for GPU pods.
//! - [`lifecycle`]: releases allocations and locks, reports GpuNodeConfig status.
//! - [`config`]: cluster-wide settings.
pub mod app;
pub mod cache;
pub mod config;
pub mod engine;
mod error;
pub mod extender;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod projection;
pub mod telemetry;
pub mod webhook;

pub use error::Error;
