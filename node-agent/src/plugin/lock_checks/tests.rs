use k8s_openapi::jiff::SignedDuration;
use serde_json::json;
use tessera_api::testing;

use super::*;
use crate::error::AllocateError;

fn lock() -> NodeLock {
    crate::plugin::test_lock("node-1", &testing::pod_ref("ml", "train", "uid-1"), "train")
}

fn pod(uid: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "ml", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
    }))
    .unwrap()
}

#[test]
fn a_lapsed_lock_is_refused_naming_lock_holder_and_times() {
    let lock = lock();
    let expires = lock.spec.expires_at.0;
    assert_eq!(unexpired(&lock, expires), Ok(()), "valid up to its expiry");
    assert_eq!(
        unexpired(&lock, expires - SignedDuration::from_secs(59)),
        Ok(())
    );
    let later = expires + SignedDuration::from_secs(1);
    let refused = unexpired(&lock, later).unwrap_err();
    assert_eq!(
        refused,
        AllocateError::LockExpired {
            lock: "node-1".into(),
            holder: "ml/train (UID uid-1)".into(),
            expired: expires.to_string(),
            now: later.to_string(),
        }
    );
    let message = refused.to_string();
    for needle in ["NodeLock node-1", "ml/train (UID uid-1)", "expired at"] {
        assert!(message.contains(needle), "{needle} not in {message}");
    }
}

#[test]
fn only_the_holder_bound_here_with_the_lock_s_uid_is_served() {
    let lock = lock();
    assert_eq!(
        holder_bound_here(&lock, Some(&pod("uid-1", Some("node-1"))), "node-1"),
        Ok(())
    );
    for (pod, reason) in [
        (None, "the pod does not exist"),
        (
            Some(pod("uid-2", Some("node-1"))),
            "has UID uid-2 (a new pod of the same name)",
        ),
        (
            Some(pod("uid-1", Some("node-2"))),
            "bound to node node-2, not node-1",
        ),
        (Some(pod("uid-1", None)), "not bound to any node"),
    ] {
        let refused = holder_bound_here(&lock, pod.as_ref(), "node-1").unwrap_err();
        let AllocateError::HolderNotHere {
            lock: name,
            holder,
            reason: why,
        } = &refused
        else {
            panic!("{refused:?}");
        };
        assert_eq!(
            (name.as_str(), holder.as_str()),
            ("node-1", "ml/train (UID uid-1)")
        );
        assert!(why.contains(reason), "{reason} not in {why}");
        assert!(
            refused
                .to_string()
                .contains("NodeLock node-1 names pod ml/train"),
            "{refused}"
        );
    }
}
