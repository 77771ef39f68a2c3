//! What Tessera's control-plane tests share (the controller's integration
//! tests and throughput benchmark, the node agent's end-to-end tests):
//!
//! - [`cluster`]: a real kube-apiserver, etcd and kube-scheduler calling the
//!   extender, the webhook and the projection running in the test process,
//!   with helpers to add nodes, GpuNodes and pods, and a stand-in for the
//!   node agent's Allocate step;
//! - [`eventually`]: wait for a condition, failing with what was awaited.
//!
//! Real-node tests share `tessera_e2e::testkit` instead; the custom
//! resources' builders are `tessera_api::testing`.

#![forbid(unsafe_code)]

pub mod cluster;

use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it holds, and returns how long that
/// took; panics naming `what` after `timeout`.
pub async fn eventually<F: AsyncFn() -> bool>(what: &str, timeout: Duration, check: F) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < timeout,
            "not within {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}
