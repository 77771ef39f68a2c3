//! NVML inside a container: devices matched to their CUDA ordinal by UUID,
//! and process queries that show only the container's processes
//! (`tests/c/probe.c`, commands `nvml`, `procs` and `hold`, against the fake
//! NVML).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use support::{Loader, MIB, Report, World};

/// A probe holding `bytes` on device 0 until it is dropped.
struct Holder(Child);

impl Holder {
    fn start(world: &World, bytes: u64) -> Self {
        let mut child = world
            .probe(Loader::Linked, true, &["hold", &bytes.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready=1");
        Self(child)
    }

    fn pid(&self) -> u64 {
        u64::from(self.0.id())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The (pid, used) entries a `procs` report lists for API version `v`.
fn listed(report: &Report, v: u32) -> Vec<(u64, u64)> {
    assert_eq!(report.get(&format!("v{v}_rc")), 0);
    (0..report.get(&format!("v{v}_count")))
        .map(|i| {
            (
                report.get(&format!("v{v}_pid_{i}")),
                report.get(&format!("v{v}_used_{i}")),
            )
        })
        .collect()
}

#[test]
fn limits_follow_the_device_uuid_when_nvml_orders_devices_otherwise() {
    // Two GPUs that NVML lists in the other order than CUDA (as when CUDA
    // enumerates fastest first and NVML in PCI order): NVML index 0 is CUDA
    // ordinal 1. Limits are per CUDA ordinal: 64 MiB on 0, 32 MiB on 1.
    let world = World::new("8g")
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("FAKE_NVML_DEVICE_ORDER", "1,0")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "64m")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "32m");
    let uuid = |index: &str| -> String {
        let report = world.run(Loader::Linked, false, &["procs", index]).ok();
        let stdout = String::from_utf8_lossy(&report.output.stdout).into_owned();
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("uuid="))
            .unwrap()
            .to_owned()
    };
    // The fakes agree on UUIDs: NVML index 0 is the driver's device 1.
    assert_eq!(uuid("0"), "GPU-7e55e4a0-fa4e-4000-8000-000000000001");
    assert_eq!(uuid("1"), "GPU-7e55e4a0-fa4e-4000-8000-000000000000");

    // 8 MiB held on CUDA ordinal 0, which NVML calls index 1.
    let _holder = Holder::start(&world, 8 * MIB);
    for loader in [Loader::Linked, Loader::Dlsym] {
        let on_cuda_1 = world.run(loader, true, &["nvml", "0"]).ok();
        assert_eq!(
            (on_cuda_1.get("total"), on_cuda_1.get("used")),
            (32 * MIB, 0),
            "{loader:?}: NVML index 0 is CUDA ordinal 1"
        );
        assert_eq!(on_cuda_1.get("v2_total"), 32 * MIB);
        let on_cuda_0 = world.run(loader, true, &["nvml", "1"]).ok();
        assert_eq!(
            (on_cuda_0.get("total"), on_cuda_0.get("used")),
            (64 * MIB, 8 * MIB),
            "{loader:?}: NVML index 1 is CUDA ordinal 0"
        );
        assert_eq!(on_cuda_0.get("free"), 56 * MIB);
    }
    // Without the preload: the physical device behind each index.
    let physical = world.run(Loader::Linked, false, &["nvml", "1"]).ok();
    assert_eq!(physical.get("total"), 8 << 30);
    assert_eq!(physical.get("used"), 8 * MIB);
    // The CUDA side is unchanged.
    let meminfo = world.run(Loader::Linked, true, &["meminfo", "1"]).ok();
    assert_eq!(meminfo.get("total"), 32 * MIB);
}

#[test]
fn limits_follow_the_device_uuid_when_the_orders_agree() {
    let world = World::new("8g")
        .env("FAKE_CUDA_DEVICE_COUNT", "2")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "32m");
    let report = world.run(Loader::Linked, true, &["nvml", "1"]).ok();
    assert_eq!(report.get("total"), 32 * MIB);
    let report = world.run(Loader::Linked, true, &["nvml", "0"]).ok();
    assert_eq!(report.get("total"), 8 << 30, "no limit on device 0");
}

#[test]
fn nvml_lists_only_the_container_s_processes() {
    // Two containers on one GPU, each with a process holding memory.
    let a = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let b = a.neighbour().env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let in_a = Holder::start(&a, 4 * MIB);
    let in_b = Holder::start(&b, 6 * MIB);
    for loader in Loader::ALL {
        for (world, holder, bytes) in [(&a, &in_a, 4 * MIB), (&b, &in_b, 6 * MIB)] {
            let report = world.run(loader, true, &["procs", "0"]).ok();
            for v in 1..=3 {
                assert_eq!(
                    listed(&report, v),
                    [(holder.pid(), bytes)],
                    "{loader:?} v{v}"
                );
                // The size query counts the container's processes only.
                assert_eq!(report.get(&format!("v{v}_size_rc")), 7, "INSUFFICIENT_SIZE");
                assert_eq!(report.get(&format!("v{v}_needed")), 1);
            }
        }
    }
    // Without the preload (or outside any container): every process.
    let report = a.run(Loader::Linked, false, &["procs", "0"]).ok();
    for v in 1..=3 {
        let mut all = listed(&report, v);
        all.sort_unstable();
        let mut expected = vec![(in_a.pid(), 4 * MIB), (in_b.pid(), 6 * MIB)];
        expected.sort_unstable();
        assert_eq!(all, expected, "v{v}");
        assert_eq!(report.get(&format!("v{v}_needed")), 2);
    }
    // CUDA_DISABLE_CONTROL: the driver's answers pass through.
    let disabled = a.same_container().env("CUDA_DISABLE_CONTROL", "true");
    let report = disabled.run(Loader::Linked, true, &["procs", "0"]).ok();
    assert_eq!(listed(&report, 3).len(), 2);
}
