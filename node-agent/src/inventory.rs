//! What the node offers: the backend's GPUs under the node's resolved
//! settings, cordoned as the Node's `hami.io/device-cordon` and the configs'
//! `cordonDevices` say, recomputed whenever the GPUs, the Node or any
//! GpuNodeConfig change, without a restart.

use tessera_api::{cordon, node_config::resolve, v1alpha1::NodeSettings};
use tokio::sync::watch;

use crate::{backend::PhysicalGpu, settings::offered, view::NodeView};

pub use crate::offer::Offer;

/// Keeps an [`Offer`] current; the first value is computed before returning.
/// Where the cluster does not serve DRA (`dra` false), a config's
/// `frontDoor: dra` is read as the device plugin, with a warning at start
/// and whenever the offer changes while one asks for it: no claim could
/// reach the node.
pub async fn track(
    view: NodeView,
    defaults: NodeSettings,
    mut physical: watch::Receiver<Vec<PhysicalGpu>>,
    dra: bool,
) -> watch::Receiver<Offer> {
    view.ready().await;
    let compute = move |view: &NodeView, physical: &[PhysicalGpu]| {
        let node = view.node_object().map(|n| n.metadata).unwrap_or_default();
        let labels = node.labels.unwrap_or_default();
        let mut resolved = resolve(view.node(), &labels, &defaults, &view.configs());
        let (door, unserved_dra) = crate::door::servable(resolved.settings.front_door, dra);
        resolved.settings.front_door = door;
        let holders = crate::holders::holders(&view.allocations());
        let mut devices = offered(physical, &resolved.settings, &holders);
        cordon::mark(
            &mut devices,
            node.annotations.as_ref(),
            &resolved.settings.cordon_devices,
            resolved.cordoned_by.as_deref(),
        );
        (Offer { resolved, devices }, unserved_dra)
    };
    let warn_dra = |unserved: bool| {
        if unserved {
            tracing::warn!(
                api = crate::dra::discovery::RESOURCE_V1,
                "a GpuNodeConfig asks for frontDoor: dra, but the cluster does not serve DRA; serving through the device plugin"
            );
        }
    };
    let (first, unserved) = compute(&view, &physical.borrow_and_update());
    warn_dra(unserved);
    let (tx, rx) = watch::channel(first);
    let mut changes = view.changes();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = physical.changed() => if changed.is_err() { return },
                changed = changes.changed() => if changed.is_err() { return },
            }
            let (offer, unserved) = compute(&view, &physical.borrow_and_update());
            tx.send_if_modified(|current| {
                let changed = *current != offer;
                if changed {
                    warn_dra(unserved);
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
