//! What the driver consumes beyond plain allocations is charged exactly:
//! VMM mappings and retained handles, memory pools, arrays, graph memory and
//! contexts. Each test runs `tests/c/charges.c` under
//! `LD_PRELOAD=libtessera_vgpu.so` through every lookup path and checks that
//! the limit is exact (up to it succeeds, one granule more fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`), that freeing returns the charge and that
//! `cuMemGetInfo` stays consistent with the fake GPU.

use support::{Loader, MIB, World};
use tessera_vgpu_region::Region;

const OOM: u64 = 2;

/// A world with one 8 GiB fake GPU and a 64 MiB limit.
fn limited() -> World {
    World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
}

#[test]
fn vmm_memory_is_charged_while_the_driver_keeps_it() {
    for loader in Loader::ALL {
        for (probe, fits) in [(32 * MIB, true), (34 * MIB, false)] {
            let world = limited();
            let args = ["vmm", &(32 * MIB).to_string(), &probe.to_string()];
            let r = world.charges(loader, true, &args).ok();
            let what = format!("{loader:?} probe={probe}");
            assert_eq!(r.get("same_handle"), 1, "{what}");
            // Released right after mapping: the mapping keeps the memory, and
            // its charge.
            assert_eq!(
                (r.get("mapped_free"), r.get("mapped_phys")),
                (32 * MIB, 32 * MIB),
                "{what}"
            );
            assert_eq!(r.get("probe_rc"), if fits { 0 } else { OOM }, "{what}");
            // The retained reference released, the mapping still holds it.
            assert_eq!(
                (
                    r.get("retained_released_free"),
                    r.get("retained_released_phys")
                ),
                (32 * MIB, 32 * MIB),
                "{what}"
            );
            assert_eq!(
                (
                    r.get("unmapped_free"),
                    r.get("unmapped_total"),
                    r.get("unmapped_phys")
                ),
                (64 * MIB, 64 * MIB, 0),
                "{what}"
            );
            let region = Region::open(&world.region_path()).unwrap();
            assert_eq!(region.used(0), 0, "{what}");
        }
    }
}

#[test]
fn pools_are_charged_what_they_hold() {
    // 3 MiB allocations take 4 MiB granules: 16 fill 64 MiB.
    let keep_all = u64::MAX.to_string();
    let keep_8m = (8 * MIB).to_string();
    for loader in Loader::ALL {
        for which in ["default", "default_ptsz", "created", "created_ptsz"] {
            for threshold in ["0", &keep_8m, &keep_all] {
                let world = limited();
                let args = ["pool", which, &(3 * MIB).to_string(), "100", threshold];
                let r = world.charges(loader, true, &args).ok();
                let what = format!("{loader:?} {which} threshold={threshold}");
                // What the pool keeps after a synchronisation.
                let kept = match threshold {
                    "0" => 0,
                    t if t == keep_8m => 8 * MIB,
                    _ => 64 * MIB,
                };
                assert_eq!((r.get("allocated"), r.get("last_rc")), (16, OOM), "{what}");
                assert_eq!(r.get("full_reserved"), 64 * MIB, "{what}");
                assert_eq!(
                    (r.get("full_free"), r.get("full_total"), r.get("full_phys")),
                    (0, 64 * MIB, 64 * MIB),
                    "{what}"
                );
                // Freed: the pool still holds everything, and is charged it.
                assert_eq!(
                    (r.get("freed_free"), r.get("freed_phys")),
                    (0, 64 * MIB),
                    "{what}"
                );
                // Synchronised: it gave back all beyond its threshold, and the
                // charge followed.
                assert_eq!(
                    (r.get("synced_free"), r.get("synced_phys")),
                    (64 * MIB - kept, kept),
                    "{what}"
                );
                // Plain allocations get exactly what the pool does not hold.
                assert_eq!(
                    r.get("plain_allocated"),
                    (64 * MIB - kept) / (4 * MIB),
                    "{what}"
                );
                // The pool reuses what it kept: the whole limit again.
                assert_eq!((r.get("again"), r.get("again_rc")), (16, OOM), "{what}");
                assert_eq!(
                    (r.get("trimmed_free"), r.get("trimmed_phys")),
                    (64 * MIB, 0),
                    "{what}"
                );
                if which.starts_with("created") {
                    // Destroyed with one live allocation and one freed: the
                    // pool holds both until the live one is freed.
                    assert_eq!(
                        (r.get("destroyed_live_free"), r.get("destroyed_live_phys")),
                        (56 * MIB, 8 * MIB),
                        "{what}"
                    );
                    assert_eq!(
                        (r.get("destroyed_free"), r.get("destroyed_phys")),
                        (64 * MIB, 0),
                        "{what}"
                    );
                }
                let region = Region::open(&world.region_path()).unwrap();
                assert_eq!(region.used(0), 0, "{what}");
            }
        }
    }
}

#[test]
fn a_pool_that_grows_by_more_than_asked_is_charged_it_or_refused() {
    // The driver grows this pool in 32 MiB chunks: the first 4 MiB allocation
    // takes 32 MiB, which is charged; eight fit in it. The ninth grows the
    // pool past the 48 MiB limit: it is undone (freed, synchronised, the
    // pool trimmed) and refused, and the charge is what the pool holds.
    for loader in Loader::ALL {
        let world = World::new("8g")
            .env("CUDA_DEVICE_MEMORY_LIMIT", "48m")
            .env("FAKE_CUDA_POOL_CHUNK", &(32 * MIB).to_string());
        let args = ["pool", "created", &(3 * MIB).to_string(), "100", "0"];
        let r = world.charges(loader, true, &args).ok();
        assert_eq!(
            (r.get("allocated"), r.get("last_rc")),
            (8, OOM),
            "{loader:?}"
        );
        assert_eq!(r.get("full_reserved"), 32 * MIB, "{loader:?}");
        assert_eq!(
            (r.get("full_free"), r.get("full_phys")),
            (16 * MIB, 32 * MIB),
            "{loader:?}"
        );
        assert_eq!(r.get("synced_free"), 48 * MIB, "{loader:?}");
        assert_eq!(r.get("plain_allocated"), 12, "{loader:?}");
        assert_eq!(r.get("again"), 8, "{loader:?}");
        let region = Region::open(&world.region_path()).unwrap();
        assert_eq!(region.used(0), 0, "{loader:?}");
    }
}

/// One array shape of `arrays_are_charged_their_footprint`: the `array`
/// command's arguments, how many fit in 64 MiB and what is left free then.
struct ArrayCase {
    args: [&'static str; 8],
    fit: u64,
    left: u64,
}

#[test]
fn arrays_are_charged_their_footprint() {
    // args: kind, width, height, depth, format, channels, levels, flags.
    let cases = [
        // 1024 × 1024 float4: 16 MiB, exactly four.
        ArrayCase {
            args: ["2d", "1024", "1024", "0", "0x20", "4", "1", "0"],
            fit: 4,
            left: 0,
        },
        // A 1D array of 1000 bytes takes a granule.
        ArrayCase {
            args: ["2d", "1000", "0", "0", "0x01", "1", "1", "0"],
            fit: 32,
            left: 0,
        },
        // 128³ float: 8 MiB.
        ArrayCase {
            args: ["3d", "128", "128", "128", "0x20", "1", "1", "0"],
            fit: 8,
            left: 0,
        },
        // A 512² float cubemap: six 1 MiB faces.
        ArrayCase {
            args: ["3d", "512", "512", "6", "0x20", "1", "1", "0x04"],
            fit: 10,
            left: 4 * MIB,
        },
        // 1024² RGBA8 with all 11 levels: 5.3 MiB, i.e. 6 MiB.
        ArrayCase {
            args: ["mipmap", "1024", "1024", "0", "0x01", "4", "11", "0"],
            fit: 10,
            left: 4 * MIB,
        },
        // Layered: 4 layers of 512² float over 2 levels, 5 MiB → 6 MiB.
        ArrayCase {
            args: ["mipmap", "512", "512", "4", "0x20", "1", "2", "0x01"],
            fit: 10,
            left: 4 * MIB,
        },
        // Sparse arrays take nothing until memory is mapped into them.
        ArrayCase {
            args: ["3d", "1024", "1024", "0", "0x20", "4", "1", "0x40"],
            fit: 100,
            left: 64 * MIB,
        },
    ];
    for loader in Loader::ALL {
        for case in &cases {
            let world = limited();
            let mut args = vec!["array"];
            args.extend(case.args);
            args.push("100");
            let r = world.charges(loader, true, &args).ok();
            let what = format!("{loader:?} {args:?}");
            let last = if case.fit == 100 { 0 } else { OOM };
            assert_eq!(
                (r.get("allocated"), r.get("last_rc")),
                (case.fit, last),
                "{what}"
            );
            assert_eq!(
                (r.get("full_free"), r.get("full_total"), r.get("full_phys")),
                (case.left, 64 * MIB, 64 * MIB - case.left),
                "{what}"
            );
            assert_eq!(
                (r.get("destroyed_free"), r.get("destroyed_phys")),
                (64 * MIB, 0),
                "{what}"
            );
            assert_eq!(Region::open(&world.region_path()).unwrap().used(0), 0);
        }
    }
}

#[test]
fn graph_allocations_are_charged_when_instantiated() {
    for loader in Loader::ALL {
        // A 36 MiB graph does not fit beside a 30 MiB one in 64 MiB.
        let world = limited();
        let args = [
            "graph",
            &(30 * MIB).to_string(),
            &(36 * MIB).to_string(),
            &(8 * MIB).to_string(),
        ];
        let r = world.charges(loader, true, &args).ok();
        let step = |name: &str| {
            (
                r.get(&format!("{name}_free")),
                r.get(&format!("{name}_phys")),
            )
        };
        // Charged at instantiation, before the launch takes the memory.
        assert_eq!(r.get("inst1_rc"), 0, "{loader:?}");
        assert_eq!(step("inst1"), (34 * MIB, 0), "{loader:?}");
        assert_eq!(step("launched1"), (34 * MIB, 30 * MIB), "{loader:?}");
        assert_eq!(r.get("inst2_rc"), OOM, "{loader:?}");
        assert_eq!(step("inst2"), (34 * MIB, 30 * MIB), "{loader:?}");
        // The captured cuMemAllocAsync is charged with its graph.
        assert_eq!(r.get("inst3_rc"), 0, "{loader:?}");
        assert_eq!(step("inst3"), (26 * MIB, 30 * MIB), "{loader:?}");
        // A destroyed executable's memory stays cached for graphs: charged.
        assert_eq!(step("destroyed1"), (34 * MIB, 30 * MIB), "{loader:?}");
        // Instantiated again, it reuses the cache.
        assert_eq!(r.get("inst4_rc"), 0, "{loader:?}");
        assert_eq!(step("inst4"), (26 * MIB, 30 * MIB), "{loader:?}");
        // Trimmed: only the live (never launched) 8 MiB executable is left.
        assert_eq!(step("trimmed"), (56 * MIB, 0), "{loader:?}");
        assert_eq!(step("end"), (64 * MIB, 0), "{loader:?}");
        assert_eq!(Region::open(&world.region_path()).unwrap().used(0), 0);

        // 34 MiB fits exactly beside 30 MiB; then the captured 8 MiB does not.
        let world = limited();
        let args = [
            "graph",
            &(30 * MIB).to_string(),
            &(34 * MIB).to_string(),
            &(8 * MIB).to_string(),
        ];
        let r = world.charges(loader, true, &args).ok();
        let step = |name: &str| {
            (
                r.get(&format!("{name}_free")),
                r.get(&format!("{name}_phys")),
            )
        };
        assert_eq!(
            (r.get("inst2_rc"), r.get("inst3_rc")),
            (0, OOM),
            "{loader:?}"
        );
        assert_eq!(step("inst3"), (0, 64 * MIB), "{loader:?}");
        assert_eq!(step("destroyed1"), (0, 64 * MIB), "{loader:?}");
        assert_eq!(r.get("inst4_rc"), 0, "{loader:?}");
        assert_eq!(step("trimmed"), (30 * MIB, 34 * MIB), "{loader:?}");
        assert_eq!(step("end"), (64 * MIB, 0), "{loader:?}");
        assert_eq!(Region::open(&world.region_path()).unwrap().used(0), 0);
    }
}

/// A probe holding a context until it is killed.
struct Holder(std::process::Child);

impl Holder {
    fn start(world: &World) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = world
            .program("charges", Loader::Linked, true, &["ctxhold"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready=1");
        Self(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn contexts_are_charged_their_measured_footprint() {
    // Each context takes 6 MiB of the fake GPU.
    let world = || limited().env("FAKE_CUDA_CONTEXT_MEMORY", "6m");
    for loader in Loader::ALL {
        let world = world();
        let r = world.charges(loader, true, &["context"]).ok();
        let step = |name: &str| {
            assert_eq!(
                r.get(&format!("{name}_total")),
                64 * MIB,
                "{loader:?} {name}"
            );
            (
                r.get(&format!("{name}_free")),
                r.get(&format!("{name}_phys")),
            )
        };
        assert_eq!(r.get("primary_rc"), 0);
        // Measured through NVML (no context yet), then cuMemGetInfo.
        assert_eq!(step("primary"), (58 * MIB, 6 * MIB), "{loader:?}");
        assert_eq!(step("created"), (52 * MIB, 12 * MIB), "{loader:?}");
        // Retaining an existing primary context takes nothing more.
        assert_eq!(r.get("same_primary"), 1);
        assert_eq!(step("retained_twice"), (52 * MIB, 12 * MIB), "{loader:?}");
        assert_eq!(step("released_once"), (52 * MIB, 12 * MIB), "{loader:?}");
        assert_eq!(r.get("filled"), 26, "{loader:?}");
        assert_eq!(step("v3"), (46 * MIB, 18 * MIB), "{loader:?}");
        assert_eq!(step("v4"), (40 * MIB, 24 * MIB), "{loader:?}");
        assert_eq!(step("destroyed_v4"), (46 * MIB, 18 * MIB), "{loader:?}");
        assert_eq!(step("destroyed_v3"), (52 * MIB, 12 * MIB), "{loader:?}");
        // The last release destroys the primary context.
        assert_eq!(step("released"), (58 * MIB, 6 * MIB), "{loader:?}");
        assert_eq!(Region::open(&world.region_path()).unwrap().used(0), 0);
    }

    // Measured from this process's own usage in NVML's process list, which
    // other processes' allocations do not move.
    let report = world()
        .env("LIBCUDA_LOG_LEVEL", "4")
        .charges(Loader::Linked, true, &["context"])
        .ok();
    assert!(
        report
            .stderr()
            .contains("device 0: context footprint 6291456 bytes (Some(Process("),
        "{}",
        report.stderr()
    );

    // Another process's context counts for the container too.
    let world = world();
    let holder = Holder::start(&world);
    let r = world.charges(Loader::Dlsym, true, &["context"]).ok();
    // 6 MiB each: the holder's, this process's primary and cuCtxCreate_v2's.
    assert_eq!((r.get("primary_free"), r.get("filled")), (52 * MIB, 23));
    drop(holder);

    // A context that does not fit the limit is refused, and undone.
    let world = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "4m")
        .env("FAKE_CUDA_CONTEXT_MEMORY", "6m");
    let r = world.charges(Loader::ProcAddr, true, &["context"]).ok();
    assert_eq!((r.get("primary_rc"), r.get("refused_phys")), (OOM, 0));
    assert_eq!(Region::open(&world.region_path()).unwrap().used(0), 0);
}

#[test]
fn every_kind_of_allocation_racing_never_overcommits() {
    // 4 MiB each under a 10 MiB limit: at most two at once, whatever the
    // kind. Four processes (every loader) × five threads, one per kind
    // (cuMemAlloc_v2, the default pool, a created pool, arrays, VMM), start
    // together and race for 2,000 rounds each.
    let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "10m");
    let start = world.dir.path().join("go");
    let world = world.env("PROBE_START", &start.display().to_string());
    let chunk = (4 * MIB).to_string();
    let loaders = [
        Loader::Linked,
        Loader::Linked,
        Loader::Dlsym,
        Loader::ProcAddr,
    ];
    let children: Vec<_> = loaders
        .iter()
        .map(|&loader| {
            world
                .program("charges", loader, true, &["race", "paoxv", "2000", &chunk])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (ok, oom) = support::race_totals(&start, children);
    assert_eq!(ok + oom, 4 * 5 * 2000);
    assert!(ok > 0 && oom > 0, "no contention: ok={ok} oom={oom}");

    // The fake GPU's high-water mark is what the container really held.
    let stats = world.run(Loader::Linked, false, &["stats", "0"]).ok();
    assert!(
        stats.get("peak") <= 8 * MIB,
        "overcommit: physical peak {}",
        stats.get("peak")
    );
    assert_eq!(stats.get("used"), 0);
    let region = Region::open(&world.region_path()).unwrap();
    let snapshot = region.snapshot();
    assert_eq!(snapshot.devices[0].used, 0);
    assert!(snapshot.devices[0].peak <= 8 * MIB);
    assert!(snapshot.processes.iter().all(|p| p.used == [0; 16]));
}
