//! What the node offers: the backend's GPUs under the node's resolved
//! settings, recomputed whenever the GPUs, the Node's labels or any
//! GpuNodeConfig change, without a restart.

use tessera_api::{
    node_config::{Resolved, resolve},
    v1alpha1::{GpuDevice, NodeSettings},
};
use tokio::sync::watch;

use crate::{backend::PhysicalGpu, settings::offered, view::NodeView};

/// The node's offer: settings, where they came from, and the devices.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    /// The resolved settings and applied configs.
    pub resolved: Resolved,
    /// The devices under those settings.
    pub devices: Vec<GpuDevice>,
}

/// Keeps an [`Offer`] current; the first value is computed before returning.
pub async fn track(
    view: NodeView,
    defaults: NodeSettings,
    mut physical: watch::Receiver<Vec<PhysicalGpu>>,
) -> watch::Receiver<Offer> {
    view.ready().await;
    let compute = move |view: &NodeView, physical: &[PhysicalGpu]| {
        let labels = view
            .node_object()
            .and_then(|n| n.metadata.labels)
            .unwrap_or_default();
        let resolved = resolve(view.node(), &labels, &defaults, &view.configs());
        let holders = crate::mig::holders(&view.allocations());
        let devices = offered(physical, &resolved.settings, &holders);
        Offer { resolved, devices }
    };
    let first = compute(&view, &physical.borrow_and_update());
    let (tx, rx) = watch::channel(first);
    let mut changes = view.changes();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = physical.changed() => if changed.is_err() { return },
                changed = changes.changed() => if changed.is_err() { return },
            }
            let offer = compute(&view, &physical.borrow_and_update());
            tx.send_if_modified(|current| {
                let changed = *current != offer;
                if changed {
                    tracing::info!(
                        gpus = offer.devices.len(),
                        split = offer.resolved.settings.device_split_count,
                        configs = ?offer.resolved.applied,
                        "node settings or GPUs changed"
                    );
                    for conflict in &offer.resolved.conflicts {
                        tracing::warn!(?conflict, "GpuNodeConfigs of equal priority disagree");
                    }
                    *current = offer;
                }
                changed
            });
        }
    });
    rx
}
