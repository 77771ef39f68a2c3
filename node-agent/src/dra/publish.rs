//! Keeps the node's ResourceSlice as the door and the offer say: present
//! (owned by the Node) while the node serves through DRA and no other door
//! is asked for, absent otherwise.
//! A watch of the node's slices of this driver brings back a slice that is
//! deleted behind the agent's back: a starting kubelet deletes every
//! ResourceSlice of its node, and a kubelet deletes a driver's slices when
//! the driver's plugin has been gone for a while.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::watcher,
};
use tessera_kubekit::Watch;
use tokio::sync::watch;

use super::{DRIVER, published_devices, resource_slice};
use crate::{door::Door, offer::Offer, owner::owner_of, view::NodeView};

/// What to do to make the cluster's slice the wanted one.
#[derive(Clone, Debug, PartialEq)]
pub enum SliceAction {
    /// Nothing: it is as wanted.
    Keep,
    /// Create it.
    Create(Box<ResourceSlice>),
    /// Replace the current one (a higher pool generation).
    Replace(Box<ResourceSlice>),
    /// Delete it.
    Delete,
}

/// The slice the agent last wrote: its UID and what it asked for (the API
/// server stores quantities canonically, `24576Mi` as `24Gi`, so what it
/// returns is not compared with what the agent wants).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Written {
    /// The slice's UID.
    pub uid: String,
    /// The slice as the agent sent it.
    pub sent: Option<ResourceSlice>,
}

/// Compares the slice `wanted` (none: no slice) with `current`, given what
/// was `written` last; a changed slice goes up one pool generation, so the
/// scheduler reads the pool anew.
pub fn plan(
    wanted: Option<ResourceSlice>,
    current: Option<&ResourceSlice>,
    written: &Written,
) -> SliceAction {
    match (wanted, current) {
        (None, None) => SliceAction::Keep,
        (None, Some(_)) => SliceAction::Delete,
        (Some(wanted), None) => SliceAction::Create(Box::new(wanted)),
        (Some(mut wanted), Some(current)) => {
            let ours = current.metadata.uid.as_deref() == Some(written.uid.as_str());
            let same = written.sent.as_ref().is_some_and(|sent| {
                sent.spec.devices == wanted.spec.devices
                    && sent.metadata.owner_references == wanted.metadata.owner_references
            });
            if ours && same {
                return SliceAction::Keep;
            }
            wanted.spec.pool.generation = current.spec.pool.generation + 1;
            wanted.metadata.resource_version = current.metadata.resource_version.clone();
            SliceAction::Replace(Box::new(wanted))
        }
    }
}

/// Runs until the process stops.
pub async fn keep(
    view: NodeView,
    mut offers: watch::Receiver<Offer>,
    mut doors: watch::Receiver<Door>,
) {
    let node = view.node().to_owned();
    let api: Api<ResourceSlice> = Api::all(view.client().clone());
    let changed = watch::channel(0u64).0;
    let ours =
        watcher::Config::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
    let slices = Watch::new(api.clone(), ours)
        .signal(&changed)
        .spawn()
        .store();
    let mut changes = changed.subscribe();
    let _ = slices.wait_until_ready().await;
    let name = resource_slice(&node, 1, &[]).name_any();
    let mut written = Written::default();
    loop {
        // Withdrawn as soon as another door is asked for: no new claim is
        // allocated here while the node waits to switch.
        let open = doors.borrow_and_update().open_for_claims();
        let devices = published_devices(&offers.borrow_and_update());
        let wanted = if open {
            let mut slice = resource_slice(&node, 1, &devices);
            // The Node from the agent's own watch of it.
            slice.metadata.owner_references = view
                .node_object()
                .as_ref()
                .and_then(owner_of)
                .map(|o| vec![o]);
            Some(slice)
        } else {
            None
        };
        let current = slices
            .state()
            .into_iter()
            .find(|s| s.name_any() == name)
            .map(|s| (*s).clone());
        let done = match plan(wanted, current.as_ref(), &written) {
            SliceAction::Keep => Ok(()),
            SliceAction::Create(slice) => api.create(&PostParams::default(), &slice).await.map(|s| {
                tracing::info!(slice = %s.name_any(), devices = s.spec.devices.as_ref().map_or(0, Vec::len), "published the node's ResourceSlice");
                written = Written { uid: s.metadata.uid.unwrap_or_default(), sent: Some(*slice) };
            }),
            SliceAction::Replace(slice) => api.replace(&name, &PostParams::default(), &slice).await.map(|s| {
                tracing::info!(slice = %s.name_any(), generation = s.spec.pool.generation, "updated the node's ResourceSlice");
                written = Written { uid: s.metadata.uid.unwrap_or_default(), sent: Some(*slice) };
            }),
            SliceAction::Delete => match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(slice = %name, "deleted the node's ResourceSlice");
                    Ok(())
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
                Err(e) => Err(e),
            },
        };
        if let Err(error) = done {
            tracing::warn!(%error, "writing the node's ResourceSlice failed; retrying");
            tokio::time::sleep(Duration::from_secs(2)).await;
            continue;
        }
        tokio::select! {
            changed = offers.changed() => if changed.is_err() { return },
            changed = doors.changed() => if changed.is_err() { return },
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use tessera_api::testing::gpu;

    use super::*;

    #[test]
    fn a_changed_slice_goes_up_one_generation_and_a_closed_door_deletes_it() {
        let one = resource_slice("n1", 1, &[gpu(0, "A100", 81920)]);
        let two = resource_slice("n1", 1, &[gpu(0, "A100", 81920), gpu(1, "A100", 81920)]);
        let none = Written::default();
        assert_eq!(plan(None, None, &none), SliceAction::Keep);
        assert_eq!(plan(None, Some(&one), &none), SliceAction::Delete);
        assert_eq!(
            plan(Some(one.clone()), None, &none),
            SliceAction::Create(Box::new(one.clone()))
        );
        // As the API server returns it: canonical quantities, a UID.
        let mut current = one.clone();
        current.metadata.uid = Some("u1".into());
        current.spec.pool.generation = 4;
        current.metadata.resource_version = Some("77".into());
        for device in current.spec.devices.iter_mut().flatten() {
            for capacity in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                capacity.value.0 = capacity.value.0.replace("81920Mi", "80Gi");
            }
        }
        let written = Written {
            uid: "u1".into(),
            sent: Some(one.clone()),
        };
        assert_eq!(
            plan(Some(one.clone()), Some(&current), &written),
            SliceAction::Keep
        );
        // Re-created by someone else (another UID): written again.
        let theirs = Written {
            uid: "u0".into(),
            ..written.clone()
        };
        assert!(matches!(
            plan(Some(one.clone()), Some(&current), &theirs),
            SliceAction::Replace(_)
        ));
        let SliceAction::Replace(replaced) = plan(Some(two), Some(&current), &written) else {
            panic!("a slice with another GPU is replaced");
        };
        assert_eq!(replaced.spec.pool.generation, 5);
        assert_eq!(replaced.metadata.resource_version.as_deref(), Some("77"));
        assert_eq!(replaced.spec.devices.as_ref().map(Vec::len), Some(2));
    }
}
