use super::*;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn limits(first: u64) -> [u64; MAX_DEVICES] {
    let mut limits = [0; MAX_DEVICES];
    limits[0] = first;
    limits
}

fn me() -> (u32, u64) {
    let pid = std::process::id();
    (pid, process_start_time(pid).expect("own start time"))
}

#[test]
fn create_then_attach_sees_one_counter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (a, opened) = Region::create_or_open(&path, &limits(10 * MIB)).unwrap();
    assert_eq!(opened, Opened::Created);
    let (b, opened) = Region::create_or_open(&path, &limits(10 * MIB)).unwrap();
    assert_eq!(
        opened,
        Opened::Attached {
            limits_differ: false
        }
    );
    let (_, opened) = Region::create_or_open(&path, &limits(5 * MIB)).unwrap();
    assert_eq!(
        opened,
        Opened::Attached {
            limits_differ: true
        }
    );
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!(metadata.len(), REGION_SIZE as u64);
    assert_eq!(metadata.permissions().mode() & 0o777, 0o666);

    let (pid, start) = me();
    let slot = a.claim_slot(pid, start).unwrap();
    a.try_reserve(slot, 0, 4 * MIB).unwrap();
    assert_eq!(b.used(0), 4 * MIB);
    assert_eq!(b.limit(0), Some(10 * MIB));
    assert_eq!(b.limit(1), None);
}

#[test]
fn reservations_stop_exactly_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::create_or_open(&dir.path().join("r"), &limits(10 * MIB)).unwrap();
    let (pid, start) = me();
    let slot = region.claim_slot(pid, start).unwrap();
    region.try_reserve(slot, 0, 6 * MIB).unwrap();
    region.try_reserve(slot, 0, 4 * MIB).unwrap();
    assert_eq!(
        region.try_reserve(slot, 0, 1),
        Err(OverLimit {
            requested: 1,
            used: 10 * MIB,
            limit: 10 * MIB
        })
    );
    region.release(slot, 0, 4 * MIB);
    assert_eq!(region.used(0), 6 * MIB);
    // No limit on device 1: counted, never refused; u64 overflow is refused.
    region.try_reserve(slot, 1, u64::MAX - 1).unwrap();
    assert!(region.try_reserve(slot, 1, 2).is_err());
    // An ordinal beyond the region is refused.
    assert!(region.try_reserve(slot, MAX_DEVICES, 1).is_err());

    let snap = region.snapshot();
    assert_eq!(
        snap.devices[0],
        DeviceUsage {
            index: 0,
            limit: Some(10 * MIB),
            used: 6 * MIB,
            peak: 10 * MIB,
            sm_limit: None,
            sharing: Sharing::Unknown,
            busy_ns: 0,
            throttled_ns: 0,
        }
    );
    assert_eq!(snap.processes.len(), 1);
    assert_eq!(snap.processes[0].pid, pid);
    assert_eq!(snap.processes[0].used[0], 6 * MIB);
    assert_eq!(snap.processes[0].host_pid, None);
}

#[test]
fn concurrent_reservations_never_overcommit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let limit = 10 * MIB;
    Region::create_or_open(&path, &limits(limit)).unwrap();
    let (pid, start) = me();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            // Separate mappings, as separate processes would have.
            let region = Arc::new(Region::open(&path).unwrap());
            let slot = region.claim_slot(pid, start).unwrap();
            std::thread::spawn(move || {
                let mut granted = 0;
                for _ in 0..20_000 {
                    if region.try_reserve(slot, 0, 3 * MIB).is_ok() {
                        granted += 1;
                        assert!(region.used(0) <= limit);
                        region.release(slot, 0, 3 * MIB);
                    }
                }
                granted
            })
        })
        .collect();
    let granted: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let region = Region::open(&path).unwrap();
    assert!(granted > 0);
    assert_eq!(region.used(0), 0);
    // 3 MiB chunks under a 10 MiB limit: at most three at once.
    assert!(region.snapshot().devices[0].peak <= 9 * MIB);
}

#[test]
fn dead_and_reused_pids_are_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::create_or_open(&dir.path().join("r"), &limits(10 * MIB)).unwrap();

    // A process that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let child_pid = child.id();
    let child_start = process_start_time(child_pid).unwrap_or(1);
    child.wait().unwrap();
    let dead = region.claim_slot(child_pid, child_start).unwrap();
    region.try_reserve(dead, 0, 7 * MIB).unwrap();

    // Our own pid with a start time that is not ours: an earlier owner of the pid.
    let (pid, start) = me();
    let reused = region.claim_slot(pid, start + 1).unwrap();
    region.try_reserve(reused, 0, 2 * MIB).unwrap();

    let live = region.claim_slot(pid, start).unwrap();
    // Claiming with our real start time reclaimed the stale slot of our pid.
    assert_eq!(region.used(0), 7 * MIB);
    region.try_reserve(live, 0, MIB).unwrap();

    let reclaimed = region.reclaim_dead();
    assert_eq!(
        reclaimed,
        Reclaimed {
            slots: 1,
            bytes: 7 * MIB
        }
    );
    assert_eq!(region.used(0), MIB);
    assert_eq!(region.snapshot().processes.len(), 1);
    // Freed slots are claimable again; the live slot did not move.
    assert_eq!(region.claim_slot(pid, start).unwrap().index(), dead.index());
    assert_eq!(
        region
            .snapshot()
            .processes
            .iter()
            .find(|p| p.slot == live.index())
            .unwrap()
            .used[0],
        MIB
    );
}

#[test]
fn foreign_and_short_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, b"tiny").unwrap();
    assert!(matches!(
        Region::create_or_open(&short, &limits(0)),
        Err(Error::Size { found: 4, .. })
    ));
    let foreign = dir.path().join("foreign");
    let mut bytes = vec![0u8; REGION_SIZE];
    bytes[..8].copy_from_slice(&19_920_718u64.to_le_bytes());
    std::fs::write(&foreign, &bytes).unwrap();
    let err = Region::open(&foreign).err().unwrap();
    assert!(
        matches!(
            err,
            Error::NotARegion {
                magic: 19_920_718,
                ..
            }
        ),
        "{err}"
    );
    let missing = Region::open(&dir.path().join("missing")).err().unwrap();
    assert!(missing.to_string().contains("cannot open"), "{missing}");
}

#[test]
fn liveness_checks_pid_and_start_time() {
    let (pid, start) = me();
    assert!(process_alive(pid, start));
    assert!(!process_alive(pid, start + 1));
    assert!(!process_alive(0, 0));
    assert!(!process_alive(u32::MAX, 0));
}

#[test]
fn compute_limits_are_stored_and_compared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let mut sm_percent = [0; MAX_DEVICES];
    sm_percent[1] = 30;
    let with = Limits {
        memory: limits(10 * MIB),
        sm_percent,
    };
    let (region, _) = Region::create_or_open_with(&path, &with).unwrap();
    assert_eq!((region.sm_limit(0), region.sm_limit(1)), (None, Some(30)));
    let (_, opened) = Region::create_or_open_with(&path, &with).unwrap();
    assert_eq!(
        opened,
        Opened::Attached {
            limits_differ: false
        }
    );
    // Same memory limits, no compute limit: they differ.
    let (_, opened) = Region::create_or_open(&path, &limits(10 * MIB)).unwrap();
    assert_eq!(
        opened,
        Opened::Attached {
            limits_differ: true
        }
    );
    assert_eq!(region.sharing(1), Sharing::Unknown);
    region.set_sharing(1, Sharing::Exclusive);
    assert_eq!(region.sharing(1), Sharing::Exclusive);
    let snap = region.snapshot();
    assert_eq!(snap.devices[1].sm_limit, Some(30));
    assert_eq!(snap.devices[1].sharing, Sharing::Exclusive);
}

#[test]
fn the_budget_refills_at_the_limit_and_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::create_or_open(&dir.path().join("r"), &limits(0)).unwrap();
    let s = 1_000_000_000u64;
    // The first refill starts the clock with an empty budget.
    assert_eq!(region.refill(0, 10 * s, 25, 50_000_000), 0);
    // 4 ms of wall time at 25 % is 1 ms of GPU time.
    assert_eq!(
        region.refill(0, 10 * s + 4_000_000, 25, 50_000_000),
        1_000_000
    );
    region.charge(0, 3_000_000);
    assert_eq!(region.tokens(0), -2_000_000);
    // A correction gives back what an estimate over-charged.
    region.charge(0, -500_000);
    assert_eq!(region.tokens(0), -1_500_000);
    // The same instant is credited once; time going backwards credits nothing.
    assert_eq!(
        region.refill(0, 10 * s + 4_000_000, 25, 50_000_000),
        -1_500_000
    );
    assert_eq!(region.refill(0, 10 * s, 25, 50_000_000), -1_500_000);
    // A long idle period saves up at most the cap.
    assert_eq!(region.refill(0, 20 * s, 25, 50_000_000), 50_000_000);
    region.record_compute(0, 7, 9);
    let snap = region.snapshot();
    assert_eq!(
        (snap.devices[0].busy_ns, snap.devices[0].throttled_ns),
        (7, 9)
    );
    // Other devices are untouched.
    assert_eq!(region.tokens(1), 0);
}
