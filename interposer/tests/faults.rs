//! The interposer against a failing or slow driver: the fake driver's fault
//! and latency injection (`FAKE_CUDA_FAIL`, `FAKE_CUDA_LATENCY_US`, see
//! `fake-driver/src/inject.rs`).

use std::process::Stdio;

use support::{Loader, MIB, World};
use tessera_vgpu_region::Region;

/// The container's usage and high-water mark on device 0, from its region.
fn region_usage(world: &World) -> (u64, u64) {
    let device = Region::open(&world.region_path())
        .unwrap()
        .snapshot()
        .devices[0];
    (device.used, device.peak)
}

#[test]
fn a_failed_driver_allocation_returns_its_reservation() {
    // The fourth allocation fails in the driver (after the interposer
    // reserved it); the probe stops there and frees the three it holds.
    let two = (2 * MIB).to_string();
    let cases: [(&str, i64, &[&str]); 5] = [
        ("cuMemAlloc_v2", 2, &["alloc", "plain", &two, "32"]),
        ("cuMemAlloc_v2", 999, &["alloc", "plain", &two, "32"]),
        ("cuMemAllocManaged", 1, &["alloc", "managed", &two, "32"]),
        ("cuMemAllocPitch_v2", 2, &["pitch", "2048", "1024", "32"]),
        ("cuMemCreate", 2, &["vmm", "0", &two, "32"]),
    ];
    for loader in Loader::ALL {
        for (function, code, args) in cases {
            let world = World::new("8g")
                .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
                .env("FAKE_CUDA_FAIL", &format!("{function}:{code}:3:1"));
            let report = world.run(loader, true, args).ok();
            let what = format!("{loader:?} {function} error {code}");
            assert_eq!(report.get("allocated"), 3, "{what}");
            assert_eq!(report.get("last_rc"), code as u64, "{what}");
            // The failed call was reserved (the peak saw four) and returned.
            let (used, peak) = region_usage(&world);
            assert_eq!((used, peak), (0, 8 * MIB), "{what}");
            let stats = world.run(Loader::Linked, false, &["stats", "0"]).ok();
            assert_eq!(stats.get("used"), 0, "{what}");
        }
    }
}

#[test]
fn a_failure_before_the_limit_leaves_the_whole_limit_usable() {
    // Calls 5 to 7 fail; a second run in the same container then gets
    // exactly the 32 granules of the limit.
    let world = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
        .env("FAKE_CUDA_FAIL", "cuMemAlloc_v2:999:4:3");
    let first = world
        .run(Loader::Linked, true, &["alloc", "plain", "1", "100"])
        .ok();
    assert_eq!((first.get("allocated"), first.get("last_rc")), (4, 999));
    let again = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m").env(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        &world.region_path().display().to_string(),
    );
    let second = again
        .run(Loader::Linked, true, &["alloc", "plain", "1", "100"])
        .ok();
    assert_eq!((second.get("allocated"), second.get("last_rc")), (32, 2));
}

#[test]
fn a_slow_driver_does_not_let_racing_processes_overcommit() {
    // The race of tests/preload.rs with a driver that takes 300 µs per
    // allocation and 100 µs per free: reservations stay open for the whole
    // driver call, so the window in which another process could slip past a
    // check-then-allocate is wide. 3 MiB chunks (charged 4 MiB) under 10 MiB.
    let world = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "10m")
        .env("FAKE_CUDA_LATENCY_US", "cuMemAlloc_v2:300,cuMemFree_v2:100");
    let start = world.dir.path().join("go");
    let world = world.env("PROBE_START", &start.display().to_string());
    let chunk = (3 * MIB).to_string();
    let children: Vec<_> = [Loader::Linked, Loader::Dlsym, Loader::ProcAddr]
        .iter()
        .map(|&loader| {
            world
                .probe(loader, true, &["race", "2", "150", &chunk, "0"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (ok, oom) = support::race_totals(&start, children);
    assert_eq!(ok + oom, 3 * 2 * 150);
    assert!(ok > 0 && oom > 0, "no contention: ok={ok} oom={oom}");
    let stats = world.run(Loader::Linked, false, &["stats", "0"]).ok();
    assert!(
        stats.get("peak") <= 8 * MIB,
        "physical peak {}",
        stats.get("peak")
    );
    assert_eq!(stats.get("used"), 0);
    assert_eq!(region_usage(&world).0, 0);
}

#[test]
fn malformed_injection_settings_stop_the_process() {
    let world = World::new("8g").env("FAKE_CUDA_FAIL", "cuMemAlloc_v2:oops");
    let report = world.run(Loader::Linked, false, &["alloc", "plain", "1", "1"]);
    assert_eq!(report.output.status.code(), Some(2));
    assert!(
        report
            .stderr()
            .contains("FAKE_CUDA_FAIL=\"cuMemAlloc_v2:oops\""),
        "{}",
        report.stderr()
    );
}
