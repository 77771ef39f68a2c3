//! Tessera's scheduling logic, pure: no Kubernetes client, no HTTP, no
//! async. The controllers feed it pods and node views and turn its answers
//! into webhook replies, Filter and Prioritize answers and Bind's writes.
//!
//! ```text
//! Pod ──request::parse_pod──▶ PodRequest ──engine::fit──▶ Placement ──▶ Bind
//!          │                                 │
//!   request::family (one Family per          engine: shared checks (health,
//!   accelerator family, from the             cordon, filters, split, memory,
//!   configuration's sections)                cores), scores, reasons, quota
//! ```
//!
//! - [`request`]: from a Pod and the cluster's configuration to a typed
//!   request, with HAMi's rules; each accelerator family is a
//!   [`request::Family`] ([`request::RequestConfig::families`]).
//! - [`engine`]: does a request fit a node, which devices does each
//!   container get, how good is the node, and why not.

#![forbid(unsafe_code)]

pub mod engine;
pub mod request;
