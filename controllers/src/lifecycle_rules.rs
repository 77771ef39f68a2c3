//! What the lifecycle controllers decide, and the extender asks of them:
//! pure functions of the objects, beside the engine. Neither the
//! controllers (`lifecycle`) nor the extender owns these rules; both call
//! them.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{SignedDuration, Timestamp},
};
use tessera_api::v1alpha1::{AllocationPhase, NodeLock, VgpuAllocation};

use crate::lean_pod::LeanPod;

/// Why an allocation's slices are free again, if they are. Never for a DRA
/// mirror: its claim, not a pod, holds the slices (a claim may outlive its
/// first pod or serve several); the node agent releases it when the kubelet
/// unprepares the claim, and the garbage collector removes it with the claim.
pub fn release_reason(allocation: &VgpuAllocation, pod: Option<&LeanPod>) -> Option<String> {
    if !allocation.is_live() || allocation.spec.claim.is_some() {
        return None;
    }
    let Some(pod) =
        pod.filter(|p| p.metadata.uid.as_deref() == Some(allocation.spec.pod_uid.as_str()))
    else {
        return Some("the pod was deleted".into());
    };
    match pod.phase() {
        Some(phase @ ("Succeeded" | "Failed")) => Some(format!("the pod finished ({phase})")),
        _ => None,
    }
}

/// When the slices an allocation holds for a preemptor lapse, if it is
/// such a hold and still live (see `VgpuAllocationSpec::nomination`).
pub fn hold_expiry(allocation: &VgpuAllocation) -> Option<Timestamp> {
    let nomination = allocation.spec.nomination.as_ref()?;
    allocation.is_live().then_some(nomination.expires_at.0)
}

/// Why a hold is over although its pod is still there: it lapsed before
/// the pod bound.
pub const HOLD_LAPSED: &str =
    "the preemptor did not bind before its hold on the freed slices lapsed";

/// Whether the kubelet has started the pod's containers. It does so only
/// after Allocate, so such a pod was served even if the node agent could not
/// record it (it died between answering the kubelet and writing back).
pub fn admitted(pod: &LeanPod) -> bool {
    pod.phase() == Some("Running")
        || pod.status.containers_reported
        || pod.status.init_containers_reported
}

/// Whether another vendor's device plugin says it served the pod at
/// Allocate (HAMi's `hami.io/bind-phase: success`), for `allocation`, the
/// pod's own. Only a pod bound to a vendor's devices has a plugin that
/// answers: Bind writes `allocating` before it binds the pod, the plugin
/// `success` or `failed` after. So the answer counts only where the pod is
/// bound to the allocation's node and the allocation holds no NVIDIA slice
/// (the node agent serves those and records it itself): a value the pod's
/// creator wrote (the webhook refuses it, but a pod admitted without the
/// webhook may carry it) never frees a NodeLock before the holder's
/// Allocate (review 2026-12-01, H1).
pub fn vendor_served(pod: &LeanPod, allocation: &VgpuAllocation) -> bool {
    let says_success = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(tessera_api::names::handoff::BIND_PHASE))
        .is_some_and(|phase| phase == "success");
    says_success
        && pod.metadata.uid.as_deref() == Some(allocation.spec.pod_uid.as_str())
        && pod.node_name() == Some(allocation.spec.node_name.as_str())
        && !holds_nvidia(allocation)
}

/// Whether an allocation still says `Bound` (or nothing) although its pod's
/// containers have started, or a vendor plugin served it: the agent's
/// write-back was lost, or no Tessera agent serves the pod (another
/// vendor's plugin did). A DRA mirror is written by the agent already
/// served, so never.
pub fn served_unrecorded(allocation: &VgpuAllocation, pod: Option<&LeanPod>) -> bool {
    let phase = allocation.status.as_ref().and_then(|s| s.phase);
    allocation.spec.claim.is_none()
        && matches!(phase, None | Some(AllocationPhase::Bound))
        && pod.is_some_and(|p| {
            p.metadata.uid.as_deref() == Some(allocation.spec.pod_uid.as_str())
                && (admitted(p) || vendor_served(p, allocation))
        })
}

/// Whether any slice of the allocation is an NVIDIA GPU's (served by the
/// node agent, which records it itself).
fn holds_nvidia(allocation: &VgpuAllocation) -> bool {
    allocation
        .spec
        .containers
        .iter()
        .flat_map(|c| &c.devices)
        .any(|d| d.family.is_nvidia())
}

/// What to do with a NodeLock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockAction {
    /// Nothing to write, for this reason: the holder's allocation released
    /// the lock (it left `Bound`), or is about to, by a write the
    /// allocations controller makes anyway. The object stays for the
    /// node's next pod.
    Free(String),
    /// Delete it, for this reason: its holder no longer needs it and no
    /// allocation of the holder will say so.
    Release(String),
    /// Keep it; look again when it expires.
    KeepUntil(Timestamp),
}

/// Whether a lock's holder still waits for its devices on the lock's node.
/// `allocation` is the one the lock names, if it exists.
pub fn lock_action(
    lock: &NodeLock,
    holder: Option<&LeanPod>,
    allocation: Option<&VgpuAllocation>,
    now: Timestamp,
) -> LockAction {
    if lock.spec.draining {
        // The node's stopping agent holds it; its next start deletes it.
        if lock.spec.expires_at.0 <= now {
            return LockAction::Release("the stopping agent's lock expired".into());
        }
        return LockAction::KeepUntil(lock.spec.expires_at.0);
    }
    let node = lock.metadata.name.as_deref().unwrap_or_default();
    let holder_uid = lock.spec.holder.uid.as_str();
    let allocation = allocation.filter(|a| a.spec.pod_uid == holder_uid);
    if let Some(allocation) = allocation {
        let phase = allocation.status.as_ref().and_then(|s| s.phase);
        if lock.released_by(&allocation.spec.pod_uid, phase) {
            return LockAction::Free("the holder's allocation was served".into());
        }
        if let Some(reason) = release_reason(allocation, holder) {
            return LockAction::Free(format!("the holder's allocation is released: {reason}"));
        }
        if served_unrecorded(allocation, holder) {
            return LockAction::Free(
                "the holder was served; its allocation is marked Allocated".into(),
            );
        }
    }
    let Some(pod) = holder.filter(|p| p.metadata.uid.as_deref() == Some(holder_uid)) else {
        return LockAction::Release("the holder pod was deleted".into());
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return LockAction::Release("the holder pod is being deleted".into());
    }
    if let Some(phase @ ("Succeeded" | "Failed")) = pod.phase() {
        return LockAction::Release(format!("the holder pod finished ({phase})"));
    }
    if let Some(other) = pod.node_name().filter(|n| *n != node) {
        return LockAction::Release(format!("the holder pod is bound to {other}"));
    }
    // The kubelet runs a pod's containers only after Allocate: a pod that
    // is running (or reports container states) was served, even if the
    // agent could not record it (it crashed between answering and writing).
    if admitted(pod) {
        return LockAction::Release("the holder pod's containers were started".into());
    }
    if allocation.is_some_and(|a| vendor_served(pod, a)) {
        return LockAction::Release(
            "the vendor's device plugin served the holder (hami.io/bind-phase: success)".into(),
        );
    }
    if lock.spec.expires_at.0 <= now {
        // Bound here and not served: the kubelet may still call Allocate
        // for it, and Allocate names no pod, so the node's next lock would
        // serve it the next pod's slice (review 2026-12-01, M1). The lock
        // stays until the holder is served, started, finished or deleted
        // (a kubelet that cannot serve it fails it); the agent refuses to
        // serve it past its expiry.
        if pod.node_name() == Some(node) {
            return LockAction::KeepUntil(now.saturating_add(EXPIRED_LOOK_AGAIN).unwrap_or(now));
        }
        return LockAction::Release("the lock expired".into());
    }
    LockAction::KeepUntil(lock.spec.expires_at.0)
}

/// How often a lock past its expiry whose holder is bound to its node and
/// not yet served is looked at again.
pub const EXPIRED_LOOK_AGAIN: SignedDuration = SignedDuration::from_secs(30);

/// How long an agent Lease counts as held when it does not say.
pub const DEFAULT_LEASE_SECONDS: i32 = 40;

/// What an agent's Lease says at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseVerdict {
    /// Renewed in time; it lapses at `until` unless renewed again.
    Held {
        /// When it lapses.
        until: Timestamp,
    },
    /// Not renewed in time: the agent is gone or cut off since `since`.
    Lapsed {
        /// When it lapsed.
        since: Timestamp,
    },
}

/// Whether a Lease last renewed at `renewed` for `duration_seconds` still
/// holds at `now` (like the node lifecycle controller's view of kubelets'
/// Leases). A Lease never renewed has lapsed.
pub fn lease_verdict(
    renewed: Option<Timestamp>,
    duration_seconds: Option<i32>,
    now: Timestamp,
) -> LeaseVerdict {
    let Some(renewed) = renewed else {
        return LeaseVerdict::Lapsed {
            since: Timestamp::UNIX_EPOCH,
        };
    };
    let seconds = duration_seconds
        .filter(|s| *s > 0)
        .unwrap_or(DEFAULT_LEASE_SECONDS);
    let until = renewed
        .saturating_add(SignedDuration::from_secs(seconds.into()))
        .unwrap_or(renewed);
    if until > now {
        LeaseVerdict::Held { until }
    } else {
        LeaseVerdict::Lapsed { since: until }
    }
}

/// The reason on a GpuNode's `Ready` condition when its agent's Lease lapsed.
pub const AGENT_LEASE_EXPIRED: &str = "AgentLeaseExpired";

/// The conditions a GpuNode should have once its agent's Lease lapsed at
/// `since` (`Ready` Unknown, the others kept), or `None` when its `Ready`
/// already says Unknown. The agent replaces it when it writes again.
pub fn lease_lapsed_conditions(
    current: &[Condition],
    lease: &str,
    since: Timestamp,
    now: Timestamp,
) -> Option<Vec<Condition>> {
    if current
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "Unknown")
    {
        return None;
    }
    let whole_seconds = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let unknown = Condition {
        type_: "Ready".into(),
        status: "Unknown".into(),
        reason: AGENT_LEASE_EXPIRED.into(),
        message: format!(
            "the node agent stopped renewing its Lease {lease}; it lapsed at {}",
            Timestamp::from_second(since.as_second()).unwrap_or(since)
        ),
        last_transition_time: Time(whole_seconds),
        observed_generation: None,
    };
    let mut conditions: Vec<Condition> = current
        .iter()
        .filter(|c| c.type_ != "Ready")
        .cloned()
        .collect();
    conditions.push(unknown);
    Some(conditions)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tessera_api::testing;

    use super::*;

    fn pod(uid: &str, node: Option<&str>, phase: &str) -> LeanPod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "d", "uid": uid}, "spec": {"nodeName": node, "containers": []}, "status": {"phase": phase}})).unwrap()
    }

    #[test]
    fn a_pod_read_lean_and_pruned_decides_as_the_full_pod() {
        let now = k8s_openapi::jiff::Timestamp::now();
        let holder = tessera_api::testing::pod_ref("d", "p", "u1");
        let lock = tessera_api::testing::node_lock("n1", holder, "p", now, 60);
        let allocation = tessera_api::testing::allocation("p", "u1", "n1")
            .namespace("d")
            .build();
        let started = json!([{"name": "main", "image": "i", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {"startedAt": "2026-11-25T00:00:00Z"}}}]);
        for status in [
            json!({"phase": "Pending"}),
            json!({"phase": "Pending", "containerStatuses": started}),
            json!({"phase": "Running", "containerStatuses": started}),
            json!({"phase": "Succeeded", "containerStatuses": started}),
            json!({"phase": "Failed", "containerStatuses": []}),
        ] {
            let value = crate::lean_pod::tests::full(status.clone());
            let mut lean: LeanPod = serde_json::from_value(value.clone()).unwrap();
            crate::lean_pod::prune(&mut lean);
            let whole = LeanPod::of(
                &serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(value).unwrap(),
            );
            assert_eq!(admitted(&lean), admitted(&whole), "{status}");
            assert_eq!(
                release_reason(&allocation, Some(&lean)),
                release_reason(&allocation, Some(&whole))
            );
            assert_eq!(
                served_unrecorded(&allocation, Some(&lean)),
                served_unrecorded(&allocation, Some(&whole))
            );
            assert_eq!(
                lock_action(&lock, Some(&lean), Some(&allocation), now),
                lock_action(&lock, Some(&whole), Some(&allocation), now)
            );
        }
    }

    #[test]
    fn a_hold_lapses_at_its_time_unless_released_first() {
        let at: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let hold = testing::allocation("p", "u1", "n1").held_until(at).build();
        assert_eq!(hold_expiry(&hold), Some(at));
        // A hold of a deleted pod is released as any allocation is.
        assert_eq!(
            release_reason(&hold, None).as_deref(),
            Some("the pod was deleted")
        );
        // Released, or not a hold: nothing lapses.
        let released = testing::allocation("p", "u1", "n1")
            .held_until(at)
            .phase(AllocationPhase::Released)
            .build();
        assert_eq!(hold_expiry(&released), None);
        assert_eq!(
            hold_expiry(&testing::allocation("p", "u1", "n1").build()),
            None
        );
    }

    fn allocation(uid: &str, phase: Option<&str>) -> VgpuAllocation {
        let allocation = testing::allocation("p", uid, "n1")
            .namespace("d")
            .container(testing::container(
                "c",
                vec![testing::slice("GPU-0", 0, 1, 0)],
            ));
        match phase {
            Some(phase) => allocation
                .phase(serde_json::from_value(json!(phase)).unwrap())
                .build(),
            None => allocation.build(),
        }
    }

    /// The lock of `p` on `n1`, acquired at 10:00:00 for 60 s, expiring at
    /// `expires` (a lock may say another expiry than its TTL gives).
    fn lock(expires: &str) -> NodeLock {
        let mut lock = testing::node_lock(
            "n1",
            testing::pod_ref("d", "p", "u1"),
            "p",
            "2026-11-22T10:00:00Z".parse().unwrap(),
            60,
        );
        lock.spec.expires_at = Time(expires.parse().unwrap());
        lock
    }

    #[test]
    fn allocations_are_released_when_their_pod_is_gone_or_finished() {
        let a = allocation("u1", Some("Allocated"));
        assert_eq!(
            release_reason(&a, None).as_deref(),
            Some("the pod was deleted")
        );
        assert_eq!(
            release_reason(&a, Some(&pod("u2", Some("n1"), "Running"))).as_deref(),
            Some("the pod was deleted"),
            "a new pod of the same name"
        );
        assert_eq!(
            release_reason(&a, Some(&pod("u1", Some("n1"), "Succeeded"))).as_deref(),
            Some("the pod finished (Succeeded)")
        );
        assert_eq!(
            release_reason(&a, Some(&pod("u1", Some("n1"), "Failed"))).as_deref(),
            Some("the pod finished (Failed)")
        );
        assert_eq!(
            release_reason(&a, Some(&pod("u1", Some("n1"), "Running"))),
            None
        );
        assert_eq!(
            release_reason(&allocation("u1", Some("Released")), None),
            None,
            "released once"
        );
    }

    #[test]
    fn a_dra_mirror_is_never_released_or_recorded_by_the_lifecycle_controller() {
        let mut mirror = allocation("u1", Some("Allocated"));
        mirror.spec.claim = Some(tessera_api::v1alpha1::ClaimReference {
            name: "c".into(),
            uid: "claim-uid".into(),
        });
        assert_eq!(release_reason(&mirror, None), None, "its pod is gone");
        assert_eq!(
            release_reason(&mirror, Some(&pod("u1", Some("n1"), "Succeeded"))),
            None,
            "a claim may serve a later pod"
        );
        mirror.status = None;
        assert!(!served_unrecorded(
            &mirror,
            Some(&pod("u1", Some("n1"), "Running"))
        ));
    }

    /// `p` as its creator may write it: HAMi's vendor answer set already.
    fn says_served(node: Option<&str>) -> LeanPod {
        let mut pod = pod("u1", node, "Pending");
        pod.metadata.annotations = Some(
            [(
                tessera_api::names::handoff::BIND_PHASE.to_owned(),
                "success".to_owned(),
            )]
            .into(),
        );
        pod
    }

    /// Review 2026-12-01, H1: a pod created with `hami.io/bind-phase:
    /// success` freed its node's lock before its Allocate (with its
    /// allocation not known yet, or holding NVIDIA slices), and the next
    /// pod's slice was served to it.
    #[test]
    fn a_bind_phase_the_pod_was_created_with_frees_no_lock() {
        let now: Timestamp = "2026-11-22T10:00:30Z".parse().unwrap();
        let live = lock("2026-11-22T10:01:00Z");
        let keep = LockAction::KeepUntil("2026-11-22T10:01:00Z".parse().unwrap());
        let nvidia = allocation("u1", Some("Bound"));
        let mut vendor = allocation("u1", Some("Bound"));
        vendor.spec.containers[0].devices[0].family = tessera_api::v1alpha1::DeviceFamily::Hygon;
        for (holder, allocation, what) in [
            (
                says_served(None),
                None,
                "allocation not known yet, pod unbound",
            ),
            (says_served(Some("n1")), None, "allocation not known yet"),
            (says_served(Some("n1")), Some(&nvidia), "an NVIDIA slice"),
            (
                says_served(None),
                Some(&vendor),
                "a vendor slice, pod not bound",
            ),
        ] {
            assert_eq!(
                lock_action(&live, Some(&holder), allocation, now),
                keep,
                "{what}"
            );
            if let Some(allocation) = allocation {
                assert!(!served_unrecorded(allocation, Some(&holder)), "{what}");
            }
        }
        // The vendor plugin's answer for a bound vendor pod frees it.
        let bound = says_served(Some("n1"));
        assert!(served_unrecorded(&vendor, Some(&bound)));
        assert!(matches!(
            lock_action(&live, Some(&bound), Some(&vendor), now),
            LockAction::Free(_)
        ));
    }

    /// Review 2026-12-01, M1: a lock past its expiry was released while its
    /// holder was bound and not yet served, and the next pod's lock then
    /// served the holder at its late Allocate.
    #[test]
    fn an_expired_lock_stays_while_its_holder_is_bound_here_unserved() {
        let now: Timestamp = "2026-11-22T10:05:00Z".parse().unwrap();
        let expired = lock("2026-11-22T10:01:00Z");
        let bound = allocation("u1", Some("Bound"));
        assert_eq!(
            lock_action(
                &expired,
                Some(&pod("u1", Some("n1"), "Pending")),
                Some(&bound),
                now
            ),
            LockAction::KeepUntil(now.saturating_add(EXPIRED_LOOK_AGAIN).unwrap())
        );
        assert_eq!(
            lock_action(
                &expired,
                Some(&pod("u1", None, "Pending")),
                Some(&bound),
                now
            ),
            LockAction::Release("the lock expired".into()),
            "never bound: the Bind that took it is gone"
        );
        assert!(matches!(
            lock_action(
                &expired,
                Some(&pod("u1", Some("n1"), "Running")),
                Some(&bound),
                now
            ),
            LockAction::Free(_)
        ));
        assert_eq!(
            lock_action(&expired, None, Some(&bound), now),
            LockAction::Free("the holder's allocation is released: the pod was deleted".into())
        );
    }

    #[test]
    fn a_lost_write_back_is_recognised_once_the_pod_runs() {
        let bound = allocation("u1", Some("Bound"));
        assert!(served_unrecorded(
            &bound,
            Some(&pod("u1", Some("n1"), "Running"))
        ));
        assert!(served_unrecorded(
            &allocation("u1", None),
            Some(&pod("u1", Some("n1"), "Running"))
        ));
        assert!(!served_unrecorded(
            &bound,
            Some(&pod("u1", Some("n1"), "Pending"))
        ));
        assert!(!served_unrecorded(
            &bound,
            Some(&pod("u2", Some("n1"), "Running"))
        ));
        assert!(!served_unrecorded(
            &allocation("u1", Some("Allocated")),
            Some(&pod("u1", Some("n1"), "Running"))
        ));
        assert!(!served_unrecorded(&bound, None));
    }

    #[test]
    fn locks_are_free_or_released_as_soon_as_their_holder_no_longer_needs_them() {
        let now: Timestamp = "2026-11-22T10:00:30Z".parse().unwrap();
        let live = lock("2026-11-22T10:01:00Z");
        let waiting = pod("u1", None, "Pending");
        let keep = LockAction::KeepUntil("2026-11-22T10:01:00Z".parse().unwrap());
        assert_eq!(
            lock_action(&live, Some(&waiting), None, now),
            keep,
            "bind in progress"
        );
        assert_eq!(
            lock_action(
                &live,
                Some(&pod("u1", Some("n1"), "Pending")),
                Some(&allocation("u1", Some("Bound"))),
                now
            ),
            keep
        );
        let release = |a: LockAction| match a {
            LockAction::Release(reason) => reason,
            keep => panic!("expected a release, got {keep:?}"),
        };
        assert_eq!(
            release(lock_action(&live, None, None, now)),
            "the holder pod was deleted"
        );
        assert_eq!(
            release(lock_action(
                &live,
                Some(&pod("u9", None, "Pending")),
                None,
                now
            )),
            "the holder pod was deleted"
        );
        assert_eq!(
            release(lock_action(
                &live,
                Some(&pod("u1", Some("n1"), "Failed")),
                None,
                now
            )),
            "the holder pod finished (Failed)"
        );
        assert_eq!(
            release(lock_action(
                &live,
                Some(&pod("u1", Some("n2"), "Pending")),
                None,
                now
            )),
            "the holder pod is bound to n2"
        );
        // Where the holder's allocation says (or is about to say) that the
        // lock is released, the lock stays, free, for the node's next pod.
        let free = |a: LockAction| match a {
            LockAction::Free(reason) => reason,
            other => panic!("expected the lock free as it is, got {other:?}"),
        };
        assert_eq!(
            free(lock_action(
                &live,
                Some(&waiting),
                Some(&allocation("u1", Some("Allocated"))),
                now
            )),
            "the holder's allocation was served"
        );
        assert_eq!(
            free(lock_action(
                &live,
                None,
                Some(&allocation("u1", Some("Released"))),
                now
            )),
            "the holder's allocation was served",
            "released counts as past Bound"
        );
        assert_eq!(
            free(lock_action(
                &live,
                Some(&pod("u1", Some("n1"), "Running")),
                Some(&allocation("u1", Some("Bound"))),
                now
            )),
            "the holder was served; its allocation is marked Allocated",
            "served even though the agent never recorded it: the allocations controller marks it"
        );
        assert_eq!(
            free(lock_action(
                &live,
                None,
                Some(&allocation("u1", Some("Bound"))),
                now
            )),
            "the holder's allocation is released: the pod was deleted"
        );
        assert_eq!(
            free(lock_action(
                &lock("2026-11-22T10:00:10Z"),
                Some(&pod("u1", Some("n1"), "Running")),
                Some(&allocation("u1", Some("Allocated"))),
                now
            )),
            "the holder's allocation was served",
            "a served lock past its expiry stays free, not deleted"
        );
        // Without an allocation to say so, the lock goes.
        assert_eq!(
            release(lock_action(
                &live,
                Some(&pod("u1", Some("n1"), "Running")),
                None,
                now
            )),
            "the holder pod's containers were started"
        );
        assert!(
            matches!(
                lock_action(
                    &live,
                    Some(&waiting),
                    Some(&allocation("u0", Some("Allocated"))),
                    now
                ),
                LockAction::KeepUntil(_)
            ),
            "another incarnation's allocation"
        );
        assert_eq!(
            release(lock_action(
                &lock("2026-11-22T10:00:10Z"),
                Some(&waiting),
                None,
                now
            )),
            "the lock expired"
        );
        // A stopping agent's lock names no pod: kept until it expires.
        let mut draining = lock("2026-11-22T10:01:00Z");
        draining.spec.draining = true;
        assert_eq!(lock_action(&draining, None, None, now), keep);
        draining.spec.expires_at = Time("2026-11-22T10:00:10Z".parse().unwrap());
        assert_eq!(
            release(lock_action(&draining, None, None, now)),
            "the stopping agent's lock expired"
        );
    }

    #[test]
    fn an_agent_lease_lapses_after_its_duration() {
        let at = |t: &str| -> Timestamp { t.parse().unwrap() };
        let renewed = Some(at("2026-01-01T00:00:00Z"));
        assert_eq!(
            lease_verdict(renewed, Some(40), at("2026-01-01T00:00:39Z")),
            LeaseVerdict::Held {
                until: at("2026-01-01T00:00:40Z")
            }
        );
        assert_eq!(
            lease_verdict(renewed, Some(40), at("2026-01-01T00:00:40Z")),
            LeaseVerdict::Lapsed {
                since: at("2026-01-01T00:00:40Z")
            }
        );
        assert_eq!(
            lease_verdict(renewed, None, at("2026-01-01T00:00:10Z")),
            LeaseVerdict::Held {
                until: at("2026-01-01T00:00:40Z")
            },
            "the agents' 40 s when the Lease does not say"
        );
        assert!(matches!(
            lease_verdict(None, Some(40), at("2026-01-01T00:00:10Z")),
            LeaseVerdict::Lapsed { .. }
        ));
    }

    #[test]
    fn a_lapsed_lease_makes_ready_unknown_once() {
        let at = |t: &str| -> Timestamp { t.parse().unwrap() };
        let ready: Condition = serde_json::from_value(json!({
            "type": "Ready", "status": "True", "reason": "AllGpusHealthy", "message": "1 of 1 GPUs healthy",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}))
        .unwrap();
        let other: Condition = serde_json::from_value(json!({
            "type": "Other", "status": "True", "reason": "R", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}))
        .unwrap();
        let now = at("2026-01-01T00:01:00.250Z");
        let written = lease_lapsed_conditions(
            &[other.clone(), ready],
            "tessera-agent-n1",
            at("2026-01-01T00:00:40Z"),
            now,
        )
        .unwrap();
        assert_eq!(written[0], other, "other conditions are kept");
        let unknown = &written[1];
        assert_eq!(
            (
                unknown.type_.as_str(),
                unknown.status.as_str(),
                unknown.reason.as_str()
            ),
            ("Ready", "Unknown", AGENT_LEASE_EXPIRED)
        );
        assert_eq!(unknown.last_transition_time.0, at("2026-01-01T00:01:00Z"));
        assert!(
            unknown.message.contains("tessera-agent-n1"),
            "{}",
            unknown.message
        );
        assert_eq!(
            lease_lapsed_conditions(
                &written,
                "tessera-agent-n1",
                at("2026-01-01T00:00:40Z"),
                now
            ),
            None,
            "written once"
        );
        assert!(
            lease_lapsed_conditions(&[], "l", now, now).is_some(),
            "a GpuNode without conditions is marked too"
        );
    }
}
