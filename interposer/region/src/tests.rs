use super::*;
use crate::priority::{Member, arbitrate};
use crate::{DeviceUsage, RegionFile, Snapshot, process_alive, process_start_time};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
        priority: Priority::Low,
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

#[test]
fn the_priority_is_stored_and_compared_and_old_regions_read_low() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let high = Limits {
        memory: limits(0),
        sm_percent: [0; MAX_DEVICES],
        priority: Priority::High,
    };
    let (region, _) = Region::create_or_open_with(&path, &high).unwrap();
    assert_eq!(region.priority(), Priority::High);
    assert_eq!(region.snapshot().priority, Priority::High);
    let (_, opened) = Region::create_or_open(&path, &limits(0)).unwrap();
    assert_eq!(
        opened,
        Opened::Attached {
            limits_differ: true
        }
    );
    // A region written before minor version 2 has zero there: low.
    let old = dir.path().join("old");
    let (region, _) = Region::create_or_open(&old, &limits(0)).unwrap();
    region.layout().header.priority.store(0, Ordering::Relaxed);
    region
        .layout()
        .header
        .minor_version
        .store(1, Ordering::Relaxed);
    let reopened = Region::open(&old).unwrap();
    assert_eq!(reopened.priority(), Priority::Low);
    assert_eq!(reopened.hold(), None);
}

#[test]
fn launches_are_recorded_and_holds_lapse() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::create_or_open(&dir.path().join("r"), &limits(0)).unwrap();
    let (pid, start) = me();
    let slot = region.claim_slot(pid, start).unwrap();
    assert!(!region.launched_since(2, 0));
    region.record_launch(slot, 2, 1_000);
    assert!(region.launched_since(2, 1_000));
    assert!(!region.launched_since(2, 1_001));
    assert!(!region.launched_since(1, 0));
    let process = region.snapshot().processes[0];
    assert_eq!(
        (process.active_devices, process.active_at),
        (1 << 2, Some(1_000))
    );
    // Held until 5,000 on ordinal 2 only.
    region.set_hold(1 << 2, 5_000);
    assert!(region.held(2, 4_999));
    assert!(!region.held(2, 5_000), "a hold lapses at its deadline");
    assert!(!region.held(1, 10));
    assert_eq!(region.snapshot().hold, Some((1 << 2, 5_000)));
    region.set_hold(0, 0);
    assert!(!region.held(2, 10));
    // A reclaimed slot forgets its launches.
    region.reclaim_slot(slot.index());
    assert!(!region.launched_since(2, 0));
}

#[test]
fn arbitration_holds_low_priority_containers_on_a_busy_high_priority_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str, priority| {
        let limits = Limits {
            memory: limits(0),
            sm_percent: [0; MAX_DEVICES],
            priority,
        };
        let (region, _) = Region::create_or_open_with(&dir.path().join(name), &limits).unwrap();
        let (pid, start) = me();
        let slot = region.claim_slot(pid, start).unwrap();
        (region, slot)
    };
    let (high, high_slot) = make("high", Priority::High);
    let (low, low_slot) = make("low", Priority::Low);
    let (other_low, _) = make("other-low", Priority::Low);
    let (high_2, _) = make("high-2", Priority::High);
    // GPUs "a" and "b": the high-priority container has "a" as ordinal 1;
    // the low one has "b" as 0 and "a" as 1; another low one only "b";
    // another high one shares "a" too.
    let members = [
        Member {
            region: &high,
            gpus: vec![None, Some("a")],
        },
        Member {
            region: &low,
            gpus: vec![Some("b"), Some("a")],
        },
        Member {
            region: &other_low,
            gpus: vec![Some("b")],
        },
        Member {
            region: &high_2,
            gpus: vec![Some("a")],
        },
    ];
    let s = 1_000_000_000;
    // Nobody launched: nothing is held.
    assert_eq!(arbitrate(&members, 10 * s, s / 2, s), 0);
    assert!(!low.held(1, 10 * s));
    // The high-priority container launches on "a": only the low one's "a" is held.
    high.record_launch(high_slot, 1, 10 * s);
    assert_eq!(arbitrate(&members, 10 * s + 1, s / 2, s), 1);
    assert!(low.held(1, 10 * s + 2));
    assert!(!low.held(0, 10 * s + 2));
    assert!(!other_low.held(0, 10 * s + 2));
    // High-priority containers are never held, even by each other.
    assert!(!high_2.held(0, 10 * s + 2) && !high.held(1, 10 * s + 2));
    // A low-priority container's own launches hold nobody.
    low.record_launch(low_slot, 0, 10 * s + 3);
    assert!(!other_low.held(0, 10 * s + 4));
    // Still active within the window: renewed.
    assert_eq!(arbitrate(&members, 10 * s + s / 4, s / 2, s), 1);
    assert!(low.held(1, 11 * s));
    // Idle for longer than the window: released.
    assert_eq!(arbitrate(&members, 11 * s, s / 2, s), 0);
    assert!(!low.held(1, 11 * s));
    // Without the agent a hold lapses on its own.
    high.record_launch(high_slot, 1, 20 * s);
    arbitrate(&members, 20 * s, s / 2, s);
    assert!(low.held(1, 20 * s) && !low.held(1, 21 * s));
}

mod hostile {
    //! The node agent's reader against everything a tenant can put where
    //! its region should be.

    use super::*;
    use std::os::unix::fs::symlink;

    fn region_in(dir: &Path) -> Region {
        let (region, _) = Region::create_or_open(&dir.join("region"), &limits(MIB)).unwrap();
        region
    }

    fn refused(dir: &Path) -> Error {
        RegionFile::open_beneath(dir, "region").expect_err("refused")
    }

    #[test]
    fn a_region_reads_as_the_interposer_wrote_it_and_takes_the_agents_writes() {
        let dir = tempfile::tempdir().unwrap();
        let region = region_in(dir.path());
        let (pid, start) = me();
        let slot = region.claim_slot(pid, start).unwrap();
        region.try_reserve(slot, 0, MIB / 2).unwrap();
        region.record_launch(slot, 2, 77);
        let file = RegionFile::open_beneath(dir.path(), "region").unwrap();
        assert_eq!(file.snapshot().unwrap(), region.snapshot());
        assert!(file.snapshot().unwrap().launched_since(2, 77));
        assert!(!file.snapshot().unwrap().launched_since(2, 78));
        file.set_sharing(1, Sharing::Shared).unwrap();
        file.set_sharing(MAX_DEVICES, Sharing::Shared).unwrap();
        file.set_hold(0b100, 1234).unwrap();
        file.set_host_pid(slot, 4242).unwrap();
        assert_eq!(region.sharing(1), Sharing::Shared);
        assert!(region.held(2, 1000) && !region.held(2, 1234));
        assert_eq!(region.host_pid(slot), Some(4242));
        assert_eq!(file.snapshot().unwrap(), region.snapshot());
        file.set_hold(0, 0).unwrap();
        assert_eq!(region.hold(), None);
    }

    #[test]
    fn links_fifos_directories_and_devices_are_refused_without_being_opened() {
        let dir = tempfile::tempdir().unwrap();
        let host_file = dir.path().join("host-file");
        std::fs::write(&host_file, vec![0u8; REGION_SIZE]).unwrap();
        let tenant = dir.path().join("tenant");
        std::fs::create_dir(&tenant).unwrap();
        let region = tenant.join("region");

        symlink(&host_file, &region).unwrap();
        let err = refused(&tenant);
        assert!(
            matches!(
                err,
                Error::NotAFile {
                    kind: "symbolic link",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("tenant/region"), "{err}");
        std::fs::remove_file(&region).unwrap();

        std::fs::hard_link(&host_file, &region).unwrap();
        assert!(matches!(refused(&tenant), Error::Links { links: 2, .. }));
        std::fs::remove_file(&region).unwrap();

        std::fs::create_dir(&region).unwrap();
        assert!(matches!(
            refused(&tenant),
            Error::NotAFile {
                kind: "directory",
                ..
            }
        ));
        std::fs::remove_dir(&region).unwrap();

        let c = std::ffi::CString::new(region.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let started = std::time::Instant::now();
        assert!(matches!(
            refused(&tenant),
            Error::NotAFile { kind: "FIFO", .. }
        ));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "never blocks"
        );
        std::fs::remove_file(&region).unwrap();

        // A device node (root only): refused from its O_PATH handle, never
        // opened (opening some devices has effects).
        // SAFETY: mknod with a NUL-terminated path; /dev/null's numbers.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0 {
            assert!(matches!(
                refused(&tenant),
                Error::NotAFile {
                    kind: "character device",
                    ..
                }
            ));
            std::fs::remove_file(&region).unwrap();
        }

        // The directory itself given as a link is refused too.
        symlink(&tenant, dir.path().join("linked")).unwrap();
        region_in(&tenant);
        assert!(RegionFile::open_beneath(&dir.path().join("linked"), "region").is_err());
        for name in ["", ".", "..", "a/region"] {
            assert!(matches!(
                RegionFile::open_beneath(&tenant, name),
                Err(Error::Name { .. })
            ));
        }
        assert_eq!(std::fs::read(&host_file).unwrap(), vec![0u8; REGION_SIZE]);
    }

    #[test]
    fn sizes_other_than_the_regions_are_refused_and_pending_ones_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("region");
        let missing = refused(dir.path());
        assert!(missing.is_pending(), "{missing}");

        std::fs::File::create(&path).unwrap();
        assert!(refused(dir.path()).is_pending(), "created, not sized yet");
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(REGION_SIZE as u64).unwrap();
        let zeroes = RegionFile::open_beneath(dir.path(), "region").unwrap();
        let err = zeroes.snapshot().unwrap_err();
        assert!(
            matches!(err, Error::Uninitialised { .. }) && err.is_pending(),
            "{err}"
        );

        for size in [1, REGION_SIZE as u64 - 1, REGION_SIZE as u64 + 1, 8 << 30] {
            file.set_len(size).unwrap(); // sparse: 8 GiB costs nothing
            let err = refused(dir.path());
            assert!(
                matches!(err, Error::Size { found, .. } if found == size),
                "{err}"
            );
            assert!(!err.is_pending());
        }
    }

    #[test]
    fn a_file_that_shrinks_after_the_check_is_a_short_read_and_takes_no_write() {
        let dir = tempfile::tempdir().unwrap();
        region_in(dir.path());
        let file = RegionFile::open_beneath(dir.path(), "region").unwrap();
        let raw = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("region"))
            .unwrap();
        raw.set_len(100).unwrap();
        assert!(matches!(
            file.snapshot(),
            Err(Error::ShortRead { read: 100, .. })
        ));
        assert!(matches!(
            file.set_hold(1, 5),
            Err(Error::Size { found: 100, .. })
        ));
        assert_eq!(raw.metadata().unwrap().len(), 100, "the agent grew nothing");
        raw.set_len(0).unwrap();
        assert!(matches!(
            file.snapshot(),
            Err(Error::ShortRead { read: 0, .. })
        ));
    }

    #[test]
    fn truncating_and_restoring_the_file_while_it_is_read_never_faults() {
        // The measured failure: a pod restored and truncated its region in
        // a loop, and the agent (which mapped it) died of SIGBUS. Reading
        // through RegionFile races the same loop in this process: a fault
        // would kill the test binary.
        let dir = tempfile::tempdir().unwrap();
        region_in(dir.path());
        let path = dir.path().join("region");
        let copy = std::fs::read(&path).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let attacker = {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::fs::write(&path, &copy).unwrap();
                    std::fs::File::create(&path).unwrap(); // truncate to 0
                }
            })
        };
        let (mut read, mut refused) = (0, 0);
        let until = std::time::Instant::now() + std::time::Duration::from_millis(800);
        while std::time::Instant::now() < until {
            match RegionFile::open_beneath(dir.path(), "region").and_then(|f| f.snapshot()) {
                Ok(snapshot) => {
                    read += 1;
                    assert_eq!(snapshot.devices.len(), MAX_DEVICES);
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        attacker.join().unwrap();
        assert!(read + refused > 10, "read {read}, refused {refused}");
    }

    #[test]
    fn a_lease_on_the_file_fails_the_open_instead_of_stalling_it() {
        let dir = tempfile::tempdir().unwrap();
        drop(region_in(dir.path()));
        let path = dir.path().join("region");
        // The tenant's read lease: a writer's open waits for the holder to
        // give it up, up to /proc/sys/fs/lease-break-time (45 s), unless it
        // does not block. The break notice (SIGIO, to this process) is
        // ignored here.
        // SAFETY: ignoring SIGIO process-wide; no test relies on it.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        let holder = std::fs::File::open(&path).unwrap();
        // SAFETY: fcntl on a descriptor `holder` owns.
        let leased = unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        if leased != 0 {
            eprintln!(
                "no lease on this file system: {}",
                io::Error::last_os_error()
            );
            return;
        }
        let started = std::time::Instant::now();
        let err = RegionFile::open_beneath(dir.path(), "region").unwrap_err();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{err}"
        );
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == io::ErrorKind::WouldBlock),
            "{err}"
        );
        drop(holder);
    }

    /// Bytes from a seed (xorshift), fast for a region-sized input.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn valid_bytes() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let region = region_in(dir.path());
        let (pid, start) = me();
        let slot = region.claim_slot(pid, start).unwrap();
        region.try_reserve(slot, 0, MIB).unwrap();
        std::fs::read(dir.path().join("region")).unwrap()
    }

    proptest::proptest! {
        // The case count is proptest's default (256), or PROPTEST_CASES.

        #[test]
        fn fuzz_region_bytes_parse_or_are_refused_never_panic(seed: u64, len in 0usize..REGION_SIZE * 2) {
            let bytes = noise(seed, len);
            let parsed = Snapshot::parse(&bytes, Path::new("r"));
            if len != REGION_SIZE {
                proptest::prop_assert!(matches!(parsed, Err(Error::Size { .. })), "{parsed:?}");
            }
        }

        #[test]
        fn fuzz_region_words_overwritten_parse_within_bounds(
            writes in proptest::collection::vec((0usize..REGION_SIZE / 4, proptest::prelude::any::<u32>()), 1..64),
            header_seed: u64,
            scramble_header: bool,
        ) {
            let mut bytes = valid_bytes();
            for (word, value) in writes {
                bytes[word * 4..word * 4 + 4].copy_from_slice(&value.to_ne_bytes());
            }
            if scramble_header {
                bytes[..64].copy_from_slice(&noise(header_seed, 64));
            }
            match Snapshot::parse(&bytes, Path::new("r")) {
                Ok(snapshot) => {
                    proptest::prop_assert_eq!(snapshot.devices.len(), MAX_DEVICES);
                    proptest::prop_assert!(snapshot.processes.len() <= SLOTS);
                    proptest::prop_assert!(snapshot.devices.iter().all(|d| d.sm_limit.is_none_or(|p| p > 0 && p < 100)));
                }
                Err(e) => {
                    let text = e.to_string();
                    proptest::prop_assert!(text.starts_with("shared region r:"), "{}", text);
                }
            }
        }

        #[test]
        fn fuzz_region_file_read_only_at_the_exact_size(
            seed: u64,
            len in proptest::prop_oneof![0usize..REGION_SIZE * 2, proptest::strategy::Just(REGION_SIZE)],
            valid_header: bool,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut bytes = noise(seed, len);
            if valid_header && len >= 64 {
                bytes[..64].copy_from_slice(&valid_bytes()[..64]);
            }
            std::fs::write(dir.path().join("region"), &bytes).unwrap();
            let read = RegionFile::open_beneath(dir.path(), "region").and_then(|f| f.snapshot());
            match read {
                Ok(snapshot) => {
                    proptest::prop_assert_eq!(len, REGION_SIZE);
                    proptest::prop_assert!(valid_header);
                    proptest::prop_assert!(snapshot.processes.len() <= SLOTS);
                }
                Err(Error::Size { found, .. }) => proptest::prop_assert_eq!(found, len as u64),
                Err(e) => proptest::prop_assert_eq!(len, REGION_SIZE, "{}", e),
            }
        }

        #[test]
        fn fuzz_region_header_with_absurd_counts_is_refused(field in 0usize..4, value: u32) {
            // size (u64 at 16), device_count (12), slot_count (24), slot_size (28).
            let mut bytes = valid_bytes();
            let (at, fixed) = [(16, REGION_SIZE as u32), (12, MAX_DEVICES as u32), (24, SLOTS as u32), (28, 192)][field];
            proptest::prop_assume!(value != fixed);
            bytes[at..at + 4].copy_from_slice(&value.to_ne_bytes());
            let err = Snapshot::parse(&bytes, Path::new("r")).unwrap_err();
            proptest::prop_assert!(matches!(err, Error::Header { .. }), "{}", err);
        }
    }
}
