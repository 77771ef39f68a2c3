//! Tessera's scheduling path at cluster scale (`make bench-scale`).
//!
//! A run ([`run::Running`]) starts a real etcd, kube-apiserver and
//! kube-scheduler, kwok playing the kubelet of N simulated GPU nodes
//! ([`fleet`]: their GpuNodes written by the node agent's own publisher),
//! background occupancy of one allocation per GPU ([`occupancy`]), and the
//! `tessera-controller` binary; then measures bursts of GPU and plain pods
//! ([`burst`]), the extender's latency, API requests per pod, the
//! controller's memory and CPU, a restart, and NodeLock waits
//! ([`run::Figures`], [`report`]).

#![forbid(unsafe_code)]

pub mod burst;
mod error;
pub mod fleet;
pub mod keepalive;
pub mod measure;
pub mod occupancy;
pub mod pods;
pub mod prom;
pub mod report;
pub mod rng;
pub mod run;

pub use error::Error;
