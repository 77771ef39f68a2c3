//! Kubernetes plumbing that Tessera's controller and node agent share.
//!
//! - [`watched`]: one list+watch per kind, fanned out to a reflector store,
//!   a change signal and any number of event streams ([`Watch`],
//!   [`Watched`]).
//! - [`status`]: typed status writes by server-side apply, one field
//!   manager per component ([`StatusWriter`]).
//! - [`selectors`]: whether the API server serves field selectors on a
//!   custom resource (Kubernetes 1.31 and later), for callers that filter
//!   themselves where it does not.
//!
//! It is a crate of its own because both binaries need it and neither may
//! depend on the other; `tessera-api` would have done (it already depends on
//! kube with its runtime), but it is the API contract, kept free of tasks,
//! channels and logging. This crate knows no Tessera type, so it depends on
//! nothing of the workspace and adds no edge to its graph but its two users.
#![forbid(unsafe_code)]

pub mod selectors;
pub mod status;
pub mod watched;

pub use status::StatusWriter;
pub use watched::{Watch, Watchable, Watched};
