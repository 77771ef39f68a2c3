//! The node's front door: the device plugin (HAMi's pod API) or DRA. A node
//! serves through one door at a time; the configs choose it, and the agent
//! switches only while the node holds no allocation through either door, so
//! no GPU is ever handed out through both.
//!
//! [`decide`] is pure; [`track`] keeps a [`Door`] current from the node's
//! allocations and, while it waits to leave DRA, the claims allocated from
//! its pool that no pod has started with yet.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, ResourceExt, api::ListParams};
use tessera_api::v1alpha1::{FrontDoor, GpuNode, VgpuAllocation};
use tokio::sync::watch;

use crate::{claims::allocated_from, offer::Offer, view::NodeView};

/// The door the node serves through and the one its configs ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Door {
    /// The door served now.
    pub serving: FrontDoor,
    /// The door the configs ask for.
    pub wanted: FrontDoor,
    /// While they differ: the holders the switch waits for
    /// (`namespace/name` of allocations and claims), sorted.
    pub waiting_for: Vec<String>,
}

impl Door {
    /// Serving `door`, as asked.
    pub fn settled(door: FrontDoor) -> Self {
        Self {
            serving: door,
            wanted: door,
            waiting_for: Vec::new(),
        }
    }

    /// Whether new claims may be allocated from the node's slice: it serves
    /// DRA and is asked to go on (a node waiting to switch away takes none).
    pub fn open_for_claims(&self) -> bool {
        self.serving == FrontDoor::Dra && self.wanted == FrontDoor::Dra
    }
}

/// The door a node's settings may ask for where the cluster serves DRA
/// (`dra_served`) or not: `wanted`, except DRA where the cluster does not
/// serve it, which is read as the device plugin (no claim could reach the
/// node). Also says whether that happened, for a warning.
pub fn servable(wanted: FrontDoor, dra_served: bool) -> (FrontDoor, bool) {
    if wanted == FrontDoor::Dra && !dra_served {
        (FrontDoor::DevicePlugin, true)
    } else {
        (wanted, false)
    }
}

/// What holds the node's GPUs now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    /// Live allocations through the device plugin, `namespace/name`.
    pub pods: Vec<String>,
    /// Live DRA mirrors and claims allocated from the node's pool, `namespace/name`.
    pub claims: Vec<String>,
    /// Why the claims of the node's pool could not be read, when they could
    /// not: a switch waits for it, but it is no holder and says nothing of
    /// the door the node serves.
    pub unlisted: Option<String>,
}

impl Holders {
    /// The live allocations on the node, split by door.
    pub fn of(allocations: &[VgpuAllocation]) -> Self {
        let mut holders = Self::default();
        for a in allocations.iter().filter(|a| a.is_live()) {
            let namespace = a.namespace().unwrap_or_default();
            match &a.spec.claim {
                Some(claim) => holders.claims.push(format!("{namespace}/{}", claim.name)),
                None => holders.pods.push(format!("{namespace}/{}", a.name_any())),
            }
        }
        holders
    }

    fn all(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .pods
            .iter()
            .chain(&self.claims)
            .chain(&self.unlisted)
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The door the holders came through, if any hold.
    fn door(&self) -> Option<FrontDoor> {
        if !self.claims.is_empty() {
            Some(FrontDoor::Dra)
        } else if !self.pods.is_empty() {
            Some(FrontDoor::DevicePlugin)
        } else {
            None
        }
    }
}

/// The door to serve: `current` (what the agent served last, `None` when it
/// does not know) switches to `wanted` only when nothing holds the node's
/// GPUs and the request has stood `settled` long enough for work already
/// under way (a pod the extender just bound, a claim kube-scheduler just
/// allocated from the slice) to show up as a holder. An agent that does not
/// know serves the door its holders came through, else the wanted one.
pub fn decide(
    current: Option<FrontDoor>,
    wanted: FrontDoor,
    holders: &Holders,
    settled: bool,
) -> Door {
    let Some(current) = current.or_else(|| holders.door()) else {
        return Door::settled(wanted);
    };
    let waiting_for = holders.all();
    if current == wanted || (waiting_for.is_empty() && settled) {
        return Door::settled(wanted);
    }
    Door {
        serving: current,
        wanted,
        waiting_for,
    }
}

/// How long a switch request stands before the door switches, at least:
/// long enough for the GpuNode (the extender stops placing pods) and the
/// slice's withdrawal (kube-scheduler stops allocating claims) to take
/// effect, and for what they let through to be recorded.
pub const SETTLE: Duration = Duration::from_secs(10);

/// How often a pending switch looks again (the claims of the node's pool
/// are not watched: only a switch away from DRA needs them).
const RECHECK: Duration = Duration::from_secs(2);

/// The door the node's GpuNode says was served: the agent's own last word.
/// Read until it answers (a guess could leave a door the node still
/// serves); `None` when there is no GpuNode (a new node, or a deleted one).
async fn last_served(view: &NodeView) -> Option<FrontDoor> {
    let api = Api::<GpuNode>::all(view.client().clone());
    let mut pause = Duration::from_millis(200);
    loop {
        match api.get_opt(view.node()).await {
            Ok(node) => return node.and_then(|n| n.status).map(|s| s.front_door),
            Err(error) => {
                tracing::warn!(%error, "reading the node's GpuNode for its front door; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Keeps the node's [`Door`] current. It starts from the door the node's
/// GpuNode says was served (the agent's own last word, kept across its
/// restarts), and re-decides whenever the offer's settings or the node's
/// allocations change, and every [`RECHECK`] while a switch waits.
///
/// Where the cluster does not serve DRA (`dra` false) the claims are never
/// listed (and the offer never asks for DRA: [`crate::inventory::track`]).
pub async fn track(
    view: NodeView,
    mut offers: watch::Receiver<Offer>,
    dra: bool,
) -> watch::Receiver<Door> {
    view.ready().await;
    let last = last_served(&view).await;
    let wanted = offers.borrow_and_update().resolved.settings.front_door;
    // A restarted agent lets a pending switch settle again: what was under
    // way while it was down may not be recorded yet.
    let mut asked = std::time::Instant::now();
    let first = decide(
        last,
        wanted,
        &holders(&view, last, wanted, dra).await,
        false,
    );
    log(&first);
    let (tx, rx) = watch::channel(first);
    let mut changes = view.changes();
    tokio::spawn(async move {
        loop {
            let pending = tx.borrow().serving != tx.borrow().wanted;
            tokio::select! {
                changed = offers.changed() => if changed.is_err() { return },
                changed = changes.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(RECHECK), if pending => {}
            }
            let (current, before) = {
                let door = tx.borrow();
                (door.serving, door.wanted)
            };
            let wanted = offers.borrow_and_update().resolved.settings.front_door;
            if wanted != before {
                asked = std::time::Instant::now();
            }
            let door = decide(
                Some(current),
                wanted,
                &holders(&view, Some(current), wanted, dra).await,
                asked.elapsed() >= SETTLE,
            );
            tx.send_if_modified(|was| {
                let changed = *was != door;
                if changed {
                    log(&door);
                    *was = door;
                }
                changed
            });
        }
    });
    rx
}

fn log(door: &Door) {
    if door.serving == door.wanted {
        tracing::info!(
            door = door.serving.as_str(),
            "serving the GPUs through this front door"
        );
    } else if door.waiting_for.is_empty() {
        tracing::info!(
            serving = door.serving.as_str(),
            wanted = door.wanted.as_str(),
            "front door switch requested; it settles before the door switches"
        );
    } else {
        tracing::warn!(
            serving = door.serving.as_str(),
            wanted = door.wanted.as_str(),
            holders = ?door.waiting_for,
            "front door switch waits until these release the node's GPUs"
        );
    }
}

/// The node's holders. Leaving DRA (or not knowing whether the node served
/// through it) also waits for the claims allocated from the node's pool that
/// no pod has started with yet (they have no mirror); that needs a list of
/// every claim, so it is read only then, and only once no allocation holds
/// the node (the switch waits for those anyway).
async fn holders(
    view: &NodeView,
    serving: Option<FrontDoor>,
    wanted: FrontDoor,
    dra: bool,
) -> Holders {
    let mut holders = Holders::of(&view.allocations());
    let held = !holders.pods.is_empty() || !holders.claims.is_empty();
    if dra && !held && serving != Some(FrontDoor::DevicePlugin) && wanted != FrontDoor::Dra {
        let claims = Api::<ResourceClaim>::all(view.client().clone());
        match claims.list(&ListParams::default()).await {
            Ok(list) => holders.claims.extend(
                list.items
                    .iter()
                    .filter(|c| allocated_from(c, view.node()))
                    .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any())),
            ),
            Err(error) => {
                tracing::warn!(%error, "listing ResourceClaims failed; a switch waits");
                holders.unlisted = Some("(ResourceClaims could not be listed)".into());
            }
        }
    }
    holders
}

/// The offer as the device plugin sees it: no device while the node serves
/// through DRA, so the kubelet advertises no `nvidia.com/gpu` there.
pub fn gate(
    mut offers: watch::Receiver<Offer>,
    mut doors: watch::Receiver<Door>,
) -> watch::Receiver<Offer> {
    let view = |offer: &Offer, door: &Door| {
        let mut offer = offer.clone();
        if door.serving == FrontDoor::Dra {
            offer.devices.clear();
        }
        offer
    };
    let first = view(&offers.borrow_and_update(), &doors.borrow_and_update());
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = offers.changed() => if changed.is_err() { return },
                changed = doors.changed() => if changed.is_err() { return },
            }
            let gated = view(&offers.borrow_and_update(), &doors.borrow_and_update());
            tx.send_if_modified(|was| {
                let changed = *was != gated;
                *was = gated;
                changed
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use FrontDoor::{DevicePlugin, Dra};

    fn holders(pods: &[&str], claims: &[&str]) -> Holders {
        Holders {
            pods: pods.iter().map(|&p| p.into()).collect(),
            claims: claims.iter().map(|&c| c.into()).collect(),
            unlisted: None,
        }
    }

    #[test]
    fn claims_that_could_not_be_listed_hold_nothing_and_choose_no_door() {
        // A new node (no GpuNode yet) whose claim list failed, as on a
        // cluster without resource.k8s.io/v1: it serves the wanted door.
        let unlisted = Holders {
            unlisted: Some("(ResourceClaims could not be listed)".into()),
            ..Holders::default()
        };
        assert_eq!(
            decide(None, DevicePlugin, &unlisted, false),
            Door::settled(DevicePlugin)
        );
        // Leaving DRA, it waits: the claims it cannot see may hold the GPUs.
        let door = decide(Some(Dra), DevicePlugin, &unlisted, true);
        assert_eq!(
            (door.serving, door.waiting_for),
            (Dra, vec!["(ResourceClaims could not be listed)".to_owned()])
        );
    }

    #[test]
    fn a_switch_happens_only_when_nothing_holds_the_gpus() {
        let none = Holders::default();
        assert_eq!(
            decide(Some(DevicePlugin), Dra, &none, true),
            Door::settled(Dra)
        );
        assert_eq!(
            decide(Some(Dra), DevicePlugin, &none, true),
            Door::settled(DevicePlugin)
        );
        // Not before the request has settled: work under way may not show yet.
        let early = decide(Some(Dra), DevicePlugin, &none, false);
        assert_eq!((early.serving, early.wanted), (Dra, DevicePlugin));
        assert!(early.waiting_for.is_empty());
        let busy = holders(&["ml/train"], &[]);
        assert_eq!(
            decide(Some(DevicePlugin), Dra, &busy, true),
            Door {
                serving: DevicePlugin,
                wanted: Dra,
                waiting_for: vec!["ml/train".into()],
            }
        );
        // A claim allocated but not yet prepared holds the DRA door open.
        let claimed = holders(&[], &["ml/c2", "ml/c1"]);
        let door = decide(Some(Dra), DevicePlugin, &claimed, true);
        assert_eq!(door.serving, Dra);
        assert_eq!(door.waiting_for, ["ml/c1", "ml/c2"]);
        // Staying put never waits, whatever holds the GPUs.
        assert_eq!(decide(Some(Dra), Dra, &claimed, false), Door::settled(Dra));
    }

    #[test]
    fn an_agent_that_does_not_know_follows_its_holders() {
        assert_eq!(
            decide(None, Dra, &Holders::default(), false),
            Door::settled(Dra)
        );
        let door = decide(None, Dra, &holders(&["ml/train"], &[]), true);
        assert_eq!((door.serving, door.wanted), (DevicePlugin, Dra));
        let door = decide(None, DevicePlugin, &holders(&[], &["ml/c1"]), true);
        assert_eq!((door.serving, door.wanted), (Dra, DevicePlugin));
        assert_eq!(
            decide(None, Dra, &holders(&[], &["ml/c1"]), false),
            Door::settled(Dra)
        );
    }

    #[test]
    fn only_live_allocations_hold_and_mirrors_count_as_claims() {
        use tessera_api::{testing::allocation, v1alpha1::AllocationPhase};
        let found = Holders::of(&[
            allocation("train", "p1", "n1").namespace("ml").build(),
            allocation("done", "p2", "n1")
                .phase(AllocationPhase::Released)
                .build(),
            allocation("serve", "p3", "n1")
                .namespace("ml")
                .claim("serve-gpu", "u1")
                .phase(AllocationPhase::Allocated)
                .build(),
        ]);
        assert_eq!(found, holders(&["ml/train"], &["ml/serve-gpu"]));
    }
}
