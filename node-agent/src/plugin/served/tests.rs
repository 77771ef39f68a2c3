use std::os::unix::fs::{PermissionsExt, symlink};

use super::*;

#[test]
fn answered_containers_survive_a_new_record_of_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (served, found) = Served::open(dir.path()).unwrap();
    assert_eq!(found, Found::Nothing);
    assert!(served.uncertain().is_none());
    served.add("uid-1", "c1").unwrap();
    served.add("uid-1", "c1").unwrap(); // once
    served.add("uid-2", "main").unwrap();
    let file = dir.path().join(FILE_NAME);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A restarted agent.
    let (again, found) = Served::open(dir.path()).unwrap();
    assert_eq!(found, Found::Read);
    assert_eq!(again.of("uid-1"), ["c1"]);
    assert_eq!(again.of("uid-2"), ["main"]);
    again.forget("uid-1");
    let (third, _) = Served::open(dir.path()).unwrap();
    assert!(third.of("uid-1").is_empty(), "forgotten on disk too");
    assert_eq!(third.of("uid-2"), ["main"]);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [FILE_NAME], "no temporary file is left");
}

#[test]
fn a_file_that_cannot_be_used_makes_the_record_uncertain() {
    let cases: [(&str, &[u8]); 7] = [
        ("garbage", b"not json"),
        ("unknown field", br#"{"version":1,"pods":[],"extra":1}"#),
        ("version", br#"{"version":2,"pods":[]}"#),
        ("empty uid", br#"{"version":1,"pods":[{"uid":"","containers":["a"]}]}"#),
        (
            "repeated pod",
            br#"{"version":1,"pods":[{"uid":"u","containers":["a"]},{"uid":"u","containers":["b"]}]}"#,
        ),
        (
            "repeated container",
            br#"{"version":1,"pods":[{"uid":"u","containers":["a","a"]}]}"#,
        ),
        (
            "control character",
            br#"{"version":1,"pods":[{"uid":"u","containers":["a\n"]}]}"#,
        ),
    ];
    for (what, text) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), text).unwrap();
        let (served, found) = Served::open(dir.path()).unwrap();
        assert!(matches!(found, Found::Unusable(_)), "{what}: {found:?}");
        assert!(served.uncertain().is_some(), "{what}");
        assert!(served.of("u").is_empty(), "{what}");
    }

    // Too big: never read whole.
    let dir = tempfile::tempdir().unwrap();
    let big = vec![b' '; usize::try_from(MAX_BYTES).unwrap() + 1];
    std::fs::write(dir.path().join(FILE_NAME), big).unwrap();
    let (_, found) = Served::open(dir.path()).unwrap();
    assert!(
        matches!(&found, Found::Unusable(why) if why.contains("bytes")),
        "{found:?}"
    );
}

#[test]
fn symlinks_are_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere.json");
    std::fs::write(
        &elsewhere,
        br#"{"version":1,"pods":[{"uid":"u","containers":["a"]}]}"#,
    )
    .unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    symlink(&elsewhere, state.join(FILE_NAME)).unwrap();
    let (served, found) = Served::open(&state).unwrap();
    assert!(matches!(found, Found::Unusable(_)), "{found:?}");
    assert!(served.of("u").is_empty(), "not read through the link");

    // The temporary file's name is a link: the write fails, the target is
    // untouched, and nothing is recorded.
    let target = dir.path().join("target");
    std::fs::write(&target, b"keep").unwrap();
    let temporary = state.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
    symlink(&target, &temporary).unwrap();
    assert!(served.add("u2", "c").is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert!(served.of("u2").is_empty());

    // The failed write removed the link it refused (not its target).
    assert!(std::fs::symlink_metadata(&temporary).is_err());

    // Written over the link at the file's name: replaced, not followed.
    served.add("u2", "c").unwrap();
    assert!(
        !std::fs::symlink_metadata(state.join(FILE_NAME))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read(&elsewhere).unwrap(),
        br#"{"version":1,"pods":[{"uid":"u","containers":["a"]}]}"#
    );
}

#[test]
fn the_record_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (served, _) = Served::open(dir.path()).unwrap();
    for i in 0..=MAX_PODS {
        served.add(&format!("uid-{i}"), "c").unwrap();
    }
    assert!(served.of("uid-0").is_empty(), "the oldest pod went");
    assert_eq!(served.of(&format!("uid-{MAX_PODS}")), ["c"]);
    for i in 1..MAX_CONTAINERS {
        served.add("uid-1", &format!("c{i}")).unwrap();
    }
    assert!(served.add("uid-1", "one-too-many").is_err());
    assert!(served.add("uid-1", &"x".repeat(300)).is_err());
    let size = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len();
    assert!(size <= MAX_BYTES, "{size}");
    let (again, found) = Served::open(dir.path()).unwrap();
    assert_eq!(found, Found::Read);
    assert_eq!(again.of("uid-1").len(), MAX_CONTAINERS);
}

mod known {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use tessera_api::{
        testing,
        v1alpha1::{AllocationPhase, VgpuAllocation},
    };

    use super::super::known;
    use crate::error::AllocateError;

    fn allocation(served: &[&str], phase: Option<AllocationPhase>) -> VgpuAllocation {
        testing::allocation("train", "uid-1", "node-1")
            .namespace("ml")
            .containers(
                ["c1", "c2", "c3"].map(|name| {
                    testing::container(name, vec![testing::slice("GPU-0", 0, 1000, 10)])
                }),
            )
            .served(served)
            .maybe_phase(phase)
            .build()
    }

    #[test]
    fn a_holder_from_before_an_unusable_record_with_containers_waiting_is_refused() {
        let lock =
            crate::plugin::test_lock("node-1", &testing::pod_ref("ml", "train", "uid-1"), "train");
        let acquired = lock.spec.acquired_at.0;
        let later = acquired + SignedDuration::from_secs(30);
        let why = "expected value at line 1 column 1".to_owned();
        let uncertain = Some((later, why.clone()));

        let refused = known(&lock, &allocation(&[], None), false, uncertain.as_ref());
        assert_eq!(
            refused,
            Err(AllocateError::ServedUnknown {
                holder: "ml/train (UID uid-1)".into(),
                waiting: 3,
                why: why.clone(),
            })
        );
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("cannot tell which"), "{message}");
        let two_left = allocation(&["c1"], Some(AllocationPhase::Bound));
        assert!(known(&lock, &two_left, false, uncertain.as_ref()).is_err());

        // Nothing to confuse, or nothing unknown: served.
        let one_left = allocation(&["c1", "c2"], Some(AllocationPhase::Bound));
        assert_eq!(known(&lock, &one_left, false, uncertain.as_ref()), Ok(()));
        let done = allocation(&["c1"], Some(AllocationPhase::Allocated));
        assert_eq!(known(&lock, &done, false, uncertain.as_ref()), Ok(()));
        assert_eq!(
            known(&lock, &allocation(&[], None), true, uncertain.as_ref()),
            Ok(()),
            "this agent answered it: it knows"
        );
        assert_eq!(known(&lock, &allocation(&[], None), false, None), Ok(()));
        let earlier: Timestamp = acquired - SignedDuration::from_secs(1);
        assert_eq!(
            known(&lock, &allocation(&[], None), false, Some(&(earlier, why))),
            Ok(()),
            "locked after the start: every answer is this agent's"
        );
    }
}
