//! Where the agent learns about the node's GPUs: NVML on a real node, or a
//! file describing fake GPUs for tests and demos. Both produce the same
//! [`PhysicalGpu`] list; [`watch`] polls a backend and publishes changes.
//! A backend that measures the GPUs (NVML) also reports their memory in use
//! and utilisation ([`HostUsage`]), read when the metrics are scraped.

mod fake;
mod fake_mig;
mod gpu;
mod nvml;

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

pub use fake::FakeBackend;
pub use gpu::{Backend, HostUsage, PhysicalGpu, PhysicalMig};
pub use nvml::NvmlBackend;

use crate::Error;

/// Reads the backend every `interval` and publishes the list whenever it
/// changes. A read that fails keeps the last good list (and logs why).
pub fn watch(
    backend: Arc<dyn Backend>,
    interval: Duration,
) -> Result<watch::Receiver<Vec<PhysicalGpu>>, Error> {
    let first = backend.devices()?;
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match backend.devices() {
                Ok(devices) => {
                    tx.send_if_modified(|current| {
                        let changed = *current != devices;
                        if changed {
                            tracing::info!(
                                backend = backend.name(),
                                gpus = devices.len(),
                                "GPU inventory changed"
                            );
                            *current = devices;
                        }
                        changed
                    });
                }
                Err(error) => {
                    tracing::warn!(backend = backend.name(), %error, "reading GPUs failed; keeping the last inventory")
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    Ok(rx)
}
