//! The node's GpuNode (inventory, capacity, settings applied). It is
//! written only when its content changes; liveness is the Lease
//! ([`crate::lease`]), renewed on its own schedule.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::Node,
    apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_api::names::node_annotations::GPU_READY;
use tessera_api::v1alpha1::{DeviceHealth, GpuNode, GpuNodeSpec, GpuNodeStatus};
use tokio::sync::watch;

use crate::{Error, door::Door, offer::Offer, owner::owner_of, readiness::PluginState};

/// The GpuNode status for an offer, with the device plugin in `plugin`,
/// served through `door`.
pub fn status(offer: &Offer, plugin: PluginState, door: &Door) -> GpuNodeStatus {
    GpuNodeStatus {
        settings: offer.resolved.settings.clone(),
        applied_configs: offer.resolved.applied.clone(),
        front_door: door.serving,
        conditions: vec![
            ready_condition(&offer.devices, plugin),
            door_condition(door),
        ],
        ..GpuNodeStatus::of_devices(offer.devices.clone())
    }
}

/// `FrontDoor`: true while the node serves through the door its configs
/// ask for; false, naming what holds the GPUs, while a switch waits.
fn door_condition(door: &Door) -> Condition {
    let (serving, wanted) = (door.serving.as_str(), door.wanted.as_str());
    let (status, reason, message) = if door.serving == door.wanted {
        (
            "True",
            "AsConfigured",
            format!("the GPUs are served through frontDoor {serving}"),
        )
    } else if door.waiting_for.is_empty() {
        (
            "False",
            "SwitchSettling",
            format!(
                "frontDoor {wanted} is configured and nothing holds the GPUs; the node leaves {serving} once the request has stood {} s (what was already under way must show up first)",
                crate::door::SETTLE.as_secs()
            ),
        )
    } else {
        const SHOWN: usize = 5;
        let mut holders = door.waiting_for[..door.waiting_for.len().min(SHOWN)].join(", ");
        if door.waiting_for.len() > SHOWN {
            holders.push_str(&format!(" and {} more", door.waiting_for.len() - SHOWN));
        }
        (
            "False",
            "SwitchWaiting",
            format!(
                "frontDoor {wanted} is configured, but the node still holds {} allocation(s) ({holders}); a door switches only while the node holds none, so the GPUs stay behind {serving} until they end",
                door.waiting_for.len(),
            ),
        )
    };
    Condition {
        type_: "FrontDoor".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// `Ready`: true while the kubelet can hand out GPUs here: the device
/// plugin is registered, the agent is not stopping and at least one GPU can
/// take work. The scheduler extender sends no pod to a node that is not
/// Ready (the kubelet would reject it at admission). Its transition time is
/// set when written ([`keep_transition_times`]).
fn ready_condition(devices: &[tessera_api::v1alpha1::GpuDevice], plugin: PluginState) -> Condition {
    let healthy = devices
        .iter()
        .filter(|d| d.health == DeviceHealth::Healthy)
        .count();
    let gpus = format!("{healthy} of {} GPUs healthy", devices.len());
    let (status, reason, message) = match (plugin, healthy) {
        (PluginState::Stopping, _) => (
            "False",
            "AgentStopping",
            "the node agent is shutting down".to_owned(),
        ),
        (PluginState::NotRegistered, _) => (
            "False",
            "NotRegistered",
            "the device plugin is not registered with the kubelet".to_owned(),
        ),
        (PluginState::Registered, 0) => ("False", "NoHealthyGpus", gpus),
        (PluginState::Registered, n) if n == devices.len() => ("True", "AllGpusHealthy", gpus),
        (PluginState::Registered, _) => ("True", "SomeGpusUnhealthy", gpus),
    };
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// Gives each condition the transition time it had in `previous` when its
/// status is unchanged, else now: an unchanged status is never rewritten.
fn keep_transition_times(wanted: &mut GpuNodeStatus, previous: Option<&GpuNodeStatus>) {
    for condition in &mut wanted.conditions {
        let before = previous
            .into_iter()
            .flat_map(|p| &p.conditions)
            .find(|c| c.type_ == condition.type_ && c.status == condition.status);
        let now = crate::whole_seconds_now();
        condition.last_transition_time =
            before.map_or_else(|| Time(now), |c| c.last_transition_time.clone());
    }
}

/// How often the agent checks that its GpuNode is still there as written
/// (it is deleted with a re-created Node, or by hand).
const RECHECK: Duration = Duration::from_secs(30);

/// Creates the node's GpuNode (owned by the Node, so it goes with it) and
/// writes its status whenever the offer changes; never rewrites an
/// unchanged status. Every [`RECHECK`] it reads the GpuNode back and
/// restores it if it is gone or differs.
pub async fn gpu_node(
    client: Client,
    node: String,
    mut offers: watch::Receiver<Offer>,
    mut doors: watch::Receiver<Door>,
    mut plugin: watch::Receiver<PluginState>,
    lease_lapsed: std::sync::Arc<tokio::sync::Notify>,
) {
    let api: Api<GpuNode> = Api::all(client.clone());
    let mut written: Option<GpuNodeStatus> = None;
    let mut announced: Option<String> = None;
    let mut owned = false;
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.tick().await;
    loop {
        let state = *plugin.borrow_and_update();
        let mut wanted = status(
            &offers.borrow_and_update(),
            state,
            &doors.borrow_and_update(),
        );
        keep_transition_times(&mut wanted, written.as_ref());
        if written.as_ref() != Some(&wanted) {
            match write(&client, &api, &node, &wanted).await {
                Ok(()) => written = Some(wanted),
                Err(error) => {
                    tracing::warn!(%error, "publishing the GpuNode failed; retrying");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    continue;
                }
            }
        }
        // Mirrored on the Node until that write succeeds (retried below).
        let now = readiness(written.as_ref());
        if announced.as_ref() != Some(&now) && announce(&client, &node, &now).await {
            announced = Some(now.clone());
        }
        let unannounced = announced.as_ref() != Some(&now);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(2)), if unannounced => {}
            // Until the kubelet has registered the Node, look for it every
            // second to add the owner reference the GpuNode lacks.
            () = tokio::time::sleep(Duration::from_secs(1)), if !owned && written.is_some() => {
                owned = adopt(&client, &api, &node).await;
            }
            changed = offers.changed() => if changed.is_err() { return },
            changed = plugin.changed() => if changed.is_err() { return },
            changed = doors.changed() => if changed.is_err() { return },
            () = lease_lapsed.notified() => {
                // The controller may have marked it Ready=Unknown meanwhile.
                written = None;
            }
            _ = recheck.tick() => {
                let current = api.get_opt(&node).await.ok().flatten();
                let current = current.and_then(|n| n.status);
                if current.map(|c| agents_part(c, written.as_ref())) != written {
                    tracing::info!(node, "the GpuNode is gone or changed; writing it again");
                    written = None;
                    owned = false;
                }
            }
        }
    }
}

/// The part of a GpuNode status the agent writes (`written`): on a node
/// where another vendor's plugin also serves devices, the controller adds
/// those devices to the list, and their conditions, under its own field
/// manager (docs/vendors.md, mixed nodes); they are not a change to undo.
fn agents_part(mut current: GpuNodeStatus, written: Option<&GpuNodeStatus>) -> GpuNodeStatus {
    current.devices.retain(|d| d.family.is_nvidia());
    current
        .conditions
        .retain(|c| written.is_some_and(|w| w.conditions.iter().any(|o| o.type_ == c.type_)));
    current
}

/// Writes `offer` as node `node`'s GpuNode once, as the agent does with a
/// registered device plugin: created owned by the Node, status applied
/// under the agent's field manager. Simulated nodes (the scale bench's kwok
/// nodes, which have no agent) are published through this, so their
/// GpuNodes are exactly what an agent would write.
pub async fn publish_once(client: &Client, node: &str, offer: &Offer) -> Result<(), Error> {
    let door = Door::settled(offer.resolved.settings.front_door);
    let mut wanted = status(offer, PluginState::Registered, &door);
    keep_transition_times(&mut wanted, None);
    write(client, &Api::all(client.clone()), node, &wanted).await
}

async fn write(
    client: &Client,
    api: &Api<GpuNode>,
    node: &str,
    status: &GpuNodeStatus,
) -> Result<(), Error> {
    if api
        .get_opt(node)
        .await
        .map_err(Error::kube("reading the GpuNode"))?
        .is_none()
    {
        let mut object = GpuNode::new(node, GpuNodeSpec {});
        object.metadata.owner_references = owner(client, node).await?.map(|o| vec![o]);
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => tracing::info!(node, "created GpuNode"),
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(Error::kube("creating the GpuNode")(e)),
        }
    }
    // All of the status the agent owns, each time: a field it leaves
    // empty now (no configs applied) is removed, and the conditions
    // another component set (Ready=Unknown by the controller) are taken back.
    crate::STATUS
        .apply_at(api, node, None, status)
        .await
        .map_err(Error::kube("writing the GpuNode status"))?;
    tracing::info!(node, gpus = status.gpu_count, "GpuNode status written");
    Ok(())
}

/// Gives a GpuNode created before the kubelet registered its Node the
/// owner reference it could not have then, so deleting the Node deletes it.
/// Returns whether the GpuNode is owned now.
async fn adopt(client: &Client, api: &Api<GpuNode>, node: &str) -> bool {
    let current = match api.get_opt(node).await {
        Ok(Some(current)) => current,
        Ok(None) => return false,
        Err(error) => {
            tracing::warn!(node, %error, "could not read the GpuNode");
            return false;
        }
    };
    if current
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| !o.is_empty())
    {
        return true;
    }
    match owner(client, node).await {
        Ok(Some(owner)) => {
            let patch = json!({"metadata": {"ownerReferences": [owner]}});
            match api
                .patch(node, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(node, "GpuNode now owned by its Node");
                    true
                }
                Err(error) => {
                    tracing::warn!(node, %error, "could not set the GpuNode's owner");
                    false
                }
            }
        }
        Ok(None) => false, // the Node is not registered yet
        Err(error) => {
            tracing::warn!(node, %error, "could not read the Node");
            false
        }
    }
}

/// The `Ready` condition as the Node annotation states it.
fn readiness(status: Option<&GpuNodeStatus>) -> String {
    let ready = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => "True".to_owned(),
        Some(c) => format!("False: {}", c.reason),
        None => String::new(),
    }
}

/// Mirrors readiness on the Node (see [`GPU_READY`]): kube-scheduler retries
/// the pods it could not place as soon as a Node changes. Returns whether
/// the write succeeded.
async fn announce(client: &Client, node: &str, readiness: &str) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"annotations": {GPU_READY: readiness}}});
    match nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(node, readiness, "node readiness announced");
            true
        }
        Err(error) => {
            tracing::warn!(node, %error, "announcing readiness on the Node failed; retrying");
            false
        }
    }
}

/// An owner reference to the Node, so the GpuNode is deleted with it.
pub(crate) async fn owner(client: &Client, node: &str) -> Result<Option<OwnerReference>, Error> {
    let found = Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .map_err(Error::kube("reading the Node"))?;
    Ok(found.as_ref().and_then(owner_of))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_api::v1alpha1::GpuDevice;

    fn devices(health: &[DeviceHealth]) -> Vec<GpuDevice> {
        health
            .iter()
            .map(|h| GpuDevice {
                family: Default::default(),
                network_id: None,
                uuid: "GPU-x".into(),
                split_count: 1,
                health: *h,
                ..tessera_api::testing::gpu(0, "m", 1)
            })
            .collect()
    }

    #[test]
    fn ready_follows_gpu_health() {
        use DeviceHealth::{Healthy, Unhealthy};
        let cases = [
            (
                vec![Healthy, Healthy],
                "True",
                "AllGpusHealthy",
                "2 of 2 GPUs healthy",
            ),
            (
                vec![Healthy, Unhealthy],
                "True",
                "SomeGpusUnhealthy",
                "1 of 2 GPUs healthy",
            ),
            (
                vec![Unhealthy],
                "False",
                "NoHealthyGpus",
                "0 of 1 GPUs healthy",
            ),
        ];
        for (health, status, reason, message) in cases {
            let c = ready_condition(&devices(&health), PluginState::Registered);
            assert_eq!(
                (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
                (status, reason, message)
            );
        }
    }

    #[test]
    fn not_ready_while_unregistered_or_stopping() {
        let all = devices(&[DeviceHealth::Healthy]);
        for (state, reason) in [
            (PluginState::NotRegistered, "NotRegistered"),
            (PluginState::Stopping, "AgentStopping"),
        ] {
            let c = ready_condition(&all, state);
            assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason));
        }
    }

    #[test]
    fn another_vendor_s_devices_and_conditions_are_not_the_agent_s_drift() {
        let written = GpuNodeStatus {
            conditions: vec![ready_condition(
                &devices(&[DeviceHealth::Healthy]),
                PluginState::Registered,
            )],
            ..GpuNodeStatus::of_devices(devices(&[DeviceHealth::Healthy]))
        };
        let mut current = written.clone();
        current.devices.push(GpuDevice {
            uuid: "npu-0".into(),
            family: tessera_api::v1alpha1::DeviceFamily::Ascend,
            ..GpuDevice::default()
        });
        current.conditions.push(Condition {
            type_: "VendorPluginsReady".into(),
            ..written.conditions[0].clone()
        });
        assert_eq!(agents_part(current.clone(), Some(&written)), written);
        // A change to the agent's own part is still one.
        current.devices[0].health = DeviceHealth::Unhealthy;
        assert_ne!(agents_part(current, Some(&written)), written);
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let offer = |health: &[DeviceHealth]| GpuNodeStatus {
            conditions: vec![ready_condition(&devices(health), PluginState::Registered)],
            ..Default::default()
        };
        let mut first = offer(&[DeviceHealth::Healthy]);
        keep_transition_times(&mut first, None);
        let old = Time(Timestamp::from_second(1_000).unwrap());
        first.conditions[0].last_transition_time = old.clone();
        let mut same = offer(&[DeviceHealth::Healthy]);
        keep_transition_times(&mut same, Some(&first));
        assert_eq!(same, first, "an unchanged status is not rewritten");
        let mut flipped = offer(&[DeviceHealth::Unhealthy]);
        keep_transition_times(&mut flipped, Some(&first));
        assert_ne!(flipped.conditions[0].last_transition_time, old);
        assert_eq!(
            flipped.conditions[0]
                .last_transition_time
                .0
                .subsec_nanosecond(),
            0
        );
    }
}
