//! The interposer as it is really used: `LD_PRELOAD=libtessera_vgpu.so` into
//! separate C programs that reach the (fake) driver by linking, by
//! `dlopen` + `dlsym`, and through `cuGetProcAddress_v2`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::{Loader, MIB, World};
use tessera_vgpu_region::Region;

const OOM: u64 = 2;

#[test]
fn allocation_stops_exactly_at_the_limit_on_every_lookup_path() {
    for loader in Loader::ALL {
        let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
        let chunks = world
            .run(
                loader,
                true,
                &["alloc", "plain", &(2 * MIB).to_string(), "100"],
            )
            .ok();
        assert_eq!(chunks.get("allocated"), 32, "{loader:?}");
        assert_eq!(chunks.get("last_rc"), OOM, "{loader:?}");

        let whole = world
            .run(
                loader,
                true,
                &["alloc", "plain", &(64 * MIB).to_string(), "2"],
            )
            .ok();
        assert_eq!(
            (whole.get("allocated"), whole.get("last_rc")),
            (1, OOM),
            "{loader:?}"
        );
        let over = world
            .run(
                loader,
                true,
                &["alloc", "plain", &(64 * MIB + 1).to_string(), "1"],
            )
            .ok();
        assert_eq!(
            (over.get("allocated"), over.get("last_rc")),
            (0, OOM),
            "{loader:?}"
        );

        let managed = world
            .run(loader, true, &["alloc", "managed", &MIB.to_string(), "100"])
            .ok();
        assert_eq!(
            (managed.get("allocated"), managed.get("last_rc")),
            (32, OOM),
            "{loader:?}"
        );

        // Without the preload the same program gets everything it asks for.
        let free = world
            .run(loader, false, &["alloc", "plain", &MIB.to_string(), "100"])
            .ok();
        assert_eq!(
            (free.get("allocated"), free.get("last_rc")),
            (100, 0),
            "{loader:?}"
        );
    }
}

#[test]
fn small_allocations_are_charged_whole_granules() {
    // The driver takes 2 MiB for every cuMemAlloc, however small: 32 one-byte
    // allocations fill a 64 MiB limit in real memory, and the 33rd is refused.
    for loader in Loader::ALL {
        let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
        let report = world
            .run(loader, true, &["alloc", "plain", "1", "100"])
            .ok();
        assert_eq!(
            (report.get("allocated"), report.get("last_rc")),
            (32, OOM),
            "{loader:?}"
        );
        let stats = world.run(loader, false, &["stats", "0"]).ok();
        assert_eq!((stats.get("peak"), stats.get("used")), (64 * MIB, 0));
        let region = Region::open(&world.region_path()).unwrap();
        assert_eq!(region.used(0), 0, "{loader:?}");
        assert_eq!(region.snapshot().devices[0].peak, 64 * MIB, "{loader:?}");
    }
    // Unlimited, 100 one-byte allocations really take 200 MiB.
    let world = World::new("8g");
    world
        .run(Loader::Linked, false, &["alloc", "plain", "1", "100"])
        .ok();
    let stats = world.run(Loader::Linked, false, &["stats", "0"]).ok();
    assert_eq!(stats.get("peak"), 200 * MIB);
}

#[test]
fn async_allocations_are_charged_and_keep_their_stream_semantics() {
    for loader in Loader::ALL {
        for per_thread in [0u64, 1] {
            let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
            // 1 MiB each, charged 2 MiB (the granularity).
            let args = ["async", &MIB.to_string(), "100", &per_thread.to_string()];
            let report = world.run(loader, true, &args).ok();
            let what = format!("{loader:?} per_thread={per_thread}");
            assert_eq!(
                (report.get("allocated"), report.get("last_rc")),
                (32, OOM),
                "{what}"
            );
            // The driver's _ptsz functions ran for every call, and only when
            // asked for: 32 allocations and 32 frees (the refused allocation
            // never reached the driver).
            assert_eq!(report.get("per_thread_calls"), per_thread * 64, "{what}");
            let region = Region::open(&world.region_path()).unwrap();
            assert_eq!(region.used(0), 0, "{what}");
        }
    }
}

#[test]
fn pitch_allocations_are_charged_with_the_driver_s_pitch() {
    for loader in Loader::ALL {
        let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
        // 1000-byte rows are padded to 1024: 2049 rows take 2 MiB + 1 KiB,
        // i.e. two granules (1000 × 2049 bytes would fit in one).
        let report = world
            .run(loader, true, &["pitch", "1000", "2049", "100"])
            .ok();
        assert_eq!(report.get("pitch"), 1024);
        assert_eq!(
            (report.get("allocated"), report.get("last_rc")),
            (16, OOM),
            "{loader:?}"
        );
    }
}

#[test]
fn vmm_allocations_are_charged_to_the_device_they_name() {
    let world = World::new("8g")
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "8m");
    let chunk = (2 * MIB).to_string();
    for loader in Loader::ALL {
        // No current context anywhere: the device comes from the properties.
        let first = world.run(loader, true, &["vmm", "0", &chunk, "100"]).ok();
        assert_eq!(first.get("granularity"), 2 * MIB);
        assert_eq!(
            (first.get("allocated"), first.get("last_rc")),
            (32, OOM),
            "{loader:?}"
        );
        let second = world.run(loader, true, &["vmm", "1", &chunk, "100"]).ok();
        assert_eq!(
            (second.get("allocated"), second.get("last_rc")),
            (4, OOM),
            "{loader:?}"
        );
        let free = world.run(loader, false, &["vmm", "1", &chunk, "100"]).ok();
        assert_eq!(
            (free.get("allocated"), free.get("last_rc")),
            (100, 0),
            "{loader:?}"
        );
    }
    let region = Region::open(&world.region_path()).unwrap();
    assert_eq!((region.used(0), region.used(1)), (0, 0));
}

#[test]
fn mem_info_reports_the_container_s_slice() {
    let world = World::new("8g")
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "32m");
    for loader in Loader::ALL {
        let info = world.run(loader, true, &["meminfo", "0"]).ok();
        assert_eq!(
            (info.get("total"), info.get("free")),
            (64 * MIB, 64 * MIB),
            "{loader:?}"
        );
        assert_eq!(info.get("devtotal"), 64 * MIB);
        // NULL outputs get the driver's own answer, and nothing crashes.
        assert_eq!(info.get("null_free_rc"), 1);
        assert_eq!(info.get("null_total_rc"), 1);
        assert_eq!(info.get("null_devtotal_rc"), 1);
        let second = world.run(loader, true, &["meminfo", "1"]).ok();
        assert_eq!(
            (second.get("total"), second.get("devtotal")),
            (32 * MIB, 32 * MIB)
        );
    }

    // Another process of the container holds 16 MiB: free + used = total.
    let mut holder = Holder::start(&world, 16 * MIB);
    let info = world.run(Loader::Linked, true, &["meminfo", "0"]).ok();
    assert_eq!((info.get("total"), info.get("free")), (64 * MIB, 48 * MIB));
    holder.kill();

    // No limit: the driver's values pass through.
    let unlimited = World::new("8g");
    let info = unlimited.run(Loader::Linked, true, &["meminfo", "0"]).ok();
    assert_eq!(
        (info.get("total"), info.get("devtotal")),
        (8 << 30, 8 << 30)
    );
}

#[test]
fn nvml_reports_the_container_s_slice() {
    let world = World::new("8g")
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "64m");
    let mut holder = Holder::start(&world, 16 * MIB);
    for loader in Loader::ALL {
        let info = world.run(loader, true, &["nvml", "0"]).ok();
        assert_eq!(
            (info.get("total"), info.get("used"), info.get("free")),
            (64 * MIB, 16 * MIB, 48 * MIB),
            "{loader:?}"
        );
        assert_eq!(
            (
                info.get("v2_total"),
                info.get("v2_used"),
                info.get("v2_free"),
                info.get("v2_reserved")
            ),
            (64 * MIB, 16 * MIB, 48 * MIB, 0),
            "{loader:?}"
        );
        // NVML's own answers for a bad version and a NULL pointer.
        assert_eq!((info.get("bad_version_rc"), info.get("null_rc")), (25, 2));
        // Device 1 has no limit: the physical values pass through.
        let other = world.run(loader, true, &["nvml", "1"]).ok();
        assert_eq!(
            (other.get("total"), other.get("used")),
            (8 << 30, 0),
            "{loader:?}"
        );
        // Without the preload NVML shows the whole GPU.
        let raw = world.run(loader, false, &["nvml", "0"]).ok();
        assert_eq!(
            (raw.get("total"), raw.get("used")),
            (8 << 30, 16 * MIB),
            "{loader:?}"
        );
    }
    holder.kill();
}

#[test]
fn a_malformed_limit_refuses_cuda_loudly() {
    for (name, value) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", "1.5g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_2", "12x"),
    ] {
        let world = World::new("8g")
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .env(name, value);
        for loader in Loader::ALL {
            let report = world.run(loader, true, &["init"]);
            let stderr = report.stderr();
            assert!(
                stderr.contains(&format!("{name}={value:?}")),
                "{loader:?}: {stderr}"
            );
            assert!(stderr.contains("refusing CUDA"), "{stderr}");
            assert_eq!(report.ok().get("init_rc"), 3, "{loader:?}");
        }
        let alloc = world.run(Loader::Linked, true, &["alloc", "plain", "4096", "1"]);
        assert!(!alloc.output.status.success());
        assert!(String::from_utf8_lossy(&alloc.output.stdout).contains("FAIL cuInit rc=3"));
    }
}

#[test]
fn log_level_gates_what_reaches_stderr() {
    let args = ["alloc", "plain", &(8 * MIB).to_string(), "2"];
    let quiet = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "8m");
    let report = quiet.run(Loader::Linked, true, &args).ok();
    assert_eq!(report.get("allocated"), 1);
    assert_eq!(
        report.stderr(),
        "",
        "level 2 prints nothing for a refused allocation"
    );

    let info = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "8m")
        .env("LIBCUDA_LOG_LEVEL", "3");
    let stderr = info.run(Loader::Linked, true, &args).ok().stderr();
    assert!(
        stderr.contains(
            "device 0: out of memory: 8388608 bytes requested, 8388608 of 8388608 in use"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("DEBUG"), "{stderr}");

    let debug = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "8m")
        .env("LIBCUDA_LOG_LEVEL", "4");
    let stderr = debug.run(Loader::Linked, true, &args).ok().stderr();
    assert!(stderr.contains("DEBUG: claimed region slot"), "{stderr}");

    let bad = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "8m")
        .env("LIBCUDA_LOG_LEVEL", "loud");
    let report = bad.run(Loader::Linked, true, &args).ok();
    assert!(
        report.stderr().contains("LIBCUDA_LOG_LEVEL=\"loud\""),
        "{}",
        report.stderr()
    );
    assert_eq!(
        report.get("allocated"),
        1,
        "a bad log level does not stop enforcement"
    );
}

#[test]
fn disable_control_passes_everything_through() {
    let world = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
        .env("CUDA_DISABLE_CONTROL", "true");
    for loader in Loader::ALL {
        let report = world
            .run(loader, true, &["alloc", "plain", &MIB.to_string(), "100"])
            .ok();
        assert_eq!((report.get("allocated"), report.get("last_rc")), (100, 0));
        let info = world.run(loader, true, &["meminfo", "0"]).ok();
        assert_eq!(info.get("total"), 8 << 30);
    }
    assert!(
        !world.region_path().exists(),
        "a disabled interposer created the region"
    );
}

#[test]
fn non_cuda_programs_behave_exactly_as_without_the_preload() {
    // Even a configuration that would refuse CUDA changes nothing for them.
    let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "garbage");
    let script = "echo out; echo err >&2; ls / >/dev/null; exit 7";
    let run = |preload: bool| {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script]);
        world.apply(&mut cmd, preload);
        cmd.output().unwrap()
    };
    let (plain, preloaded) = (run(false), run(true));
    assert_eq!(preloaded.status.code(), Some(7));
    assert_eq!(plain.status, preloaded.status);
    assert_eq!(plain.stdout, preloaded.stdout);
    assert_eq!(
        String::from_utf8_lossy(&plain.stderr),
        String::from_utf8_lossy(&preloaded.stderr)
    );
    let mut truth = Command::new("/bin/sh");
    truth.args(["-c", "true"]);
    world.apply(&mut truth, true);
    assert!(truth.status().unwrap().success());
    assert!(
        !world.region_path().exists(),
        "a non-CUDA process created the region"
    );
}

#[test]
fn racing_processes_never_overcommit() {
    // 3 MiB chunks (charged 4 MiB) under a 10 MiB limit: at most two fit at once. Each
    // success is held for 20 µs so that the 8 threads really contend, and
    // the processes start together on a start file.
    let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "10m");
    let start = world.dir.path().join("go");
    let world = world.env("PROBE_START", &start.display().to_string());
    let chunk = (3 * MIB).to_string();
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
                .probe(loader, true, &["race", "2", "10000", &chunk, "20"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (ok, oom) = support::race_totals(&start, children);
    assert_eq!(ok + oom, 4 * 2 * 10_000);
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

#[test]
fn a_killed_process_s_memory_is_reclaimed() {
    let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
    let mut holder = Holder::start(&world, 48 * MIB);
    let squeezed = world
        .run(
            Loader::Linked,
            true,
            &["alloc", "plain", &(2 * MIB).to_string(), "100"],
        )
        .ok();
    assert_eq!(squeezed.get("allocated"), 8);
    let region = Region::open(&world.region_path()).unwrap();
    assert_eq!(region.used(0), 48 * MIB);

    holder.kill();
    // The next process that runs short reclaims the dead one's 48 MiB.
    let after = world
        .run(
            Loader::Linked,
            true,
            &["alloc", "plain", &(2 * MIB).to_string(), "100"],
        )
        .ok();
    assert_eq!((after.get("allocated"), after.get("last_rc")), (32, OOM));
    assert_eq!(region.used(0), 0);
    assert!(
        region
            .snapshot()
            .processes
            .iter()
            .all(|p| p.pid != holder.pid)
    );
}

#[test]
fn a_forked_child_is_accounted_as_its_own_process() {
    let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
    let report = world
        .run(
            Loader::Linked,
            true,
            &["fork", &(16 * MIB).to_string(), &(8 * MIB).to_string()],
        )
        .ok();
    assert_eq!(report.get("child_exit"), 0);
    // The child's 8 MiB were charged to its own slot, so they came back when
    // it exited; charged to the parent's, they would stay until the parent
    // exits and the parent would get only 20 more 1 MiB allocations (each
    // takes a 2 MiB granule) instead of 24.
    assert_eq!(report.get("allocated"), 24);
}

#[test]
fn lookups_keep_the_driver_s_answers() {
    let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
    for loader in [Loader::Dlsym, Loader::ProcAddr, Loader::Linked] {
        for (name, version, rc, status, found) in [
            ("cuMemAlloc", "12090", 0, 0, 1),
            ("cuMemAlloc", "3000", 500, 2, 0),
            ("cuNoSuchFunction", "12090", 500, 1, 0),
        ] {
            let with = world.run(loader, true, &["lookup", name, version]).ok();
            let without = world.run(loader, false, &["lookup", name, version]).ok();
            for (key, expected) in [("rc", rc), ("status", status), ("found", found)] {
                assert_eq!(with.get(key), expected, "{loader:?} {name} {version} {key}");
                assert_eq!(
                    without.get(key),
                    expected,
                    "{loader:?} {name} {version} {key}"
                );
            }
        }
    }
}

#[test]
fn the_real_driver_can_be_named_explicitly() {
    let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "8m");
    let driver = support::built().lib_dir.join("libcuda.so.1");
    let named = World::new("8g")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "8m")
        .env("TESSERA_REAL_LIBCUDA", &driver.display().to_string());
    let report = named
        .run(
            Loader::Linked,
            true,
            &["alloc", "plain", &(2 * MIB).to_string(), "100"],
        )
        .ok();
    assert_eq!(report.get("allocated"), 4);

    let missing = world.env("TESSERA_REAL_LIBCUDA", "/nonexistent/libcuda.so.1");
    let report = missing.run(Loader::Linked, true, &["init"]).ok();
    assert_eq!(report.get("init_rc"), 500);
    assert!(
        report.stderr().contains("TESSERA_REAL_LIBCUDA"),
        "{}",
        report.stderr()
    );
}

/// A probe holding an allocation until it is killed.
struct Holder {
    child: std::process::Child,
    pid: u32,
}

impl Holder {
    fn start(world: &World, bytes: u64) -> Self {
        let mut child = world
            .probe(Loader::Linked, true, &["hold", &bytes.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready=1");
        let pid = child.id();
        Self { child, pid }
    }

    /// SIGKILL, then reap.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}
