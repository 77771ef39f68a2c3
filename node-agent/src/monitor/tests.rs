use tessera_api::{
    testing,
    v1alpha1::{AllocationPhase, DeviceHealth, GpuDevice},
};

use super::*;
use crate::contract::REGION_FILE;

pub(super) fn device(uuid: &str, index: u32, health: DeviceHealth) -> GpuDevice {
    GpuDevice {
        family: Default::default(),
        network_id: None,
        uuid: uuid.into(),
        health,
        ..testing::gpu(index, testing::MODEL, 81_920)
    }
}

pub(super) fn allocation(
    pod: &str,
    uid: &str,
    mib: u64,
    phase: Option<AllocationPhase>,
) -> VgpuAllocation {
    testing::allocation(pod, uid, "n1")
        .namespace("ml")
        .container(testing::container(
            "main",
            vec![testing::slice("GPU-0", 0, mib, 30)],
        ))
        .maybe_phase(phase)
        .build()
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

fn reading(used: u64) -> Reading {
    Reading {
        used,
        ..Reading::default()
    }
}

static NO_REFUSALS: std::sync::LazyLock<std::collections::HashMap<String, u64>> =
    std::sync::LazyLock::new(Default::default);
static NO_CORE_USE: cores::CoreUse = cores::CoreUse::new();

fn scrape<'a>(
    devices: &'a [GpuDevice],
    allocations: &'a [VgpuAllocation],
    usage: &'a Usage,
) -> Scrape<'a> {
    Scrape {
        node: "n1",
        devices,
        allocations,
        usage,
        core_use: &NO_CORE_USE,
        core_policy: tessera_api::v1alpha1::CorePolicy::Default,
        refused: &NO_REFUSALS,
        host: &[],
        now_ns: 0,
        legacy: false,
    }
}

#[test]
fn devices_and_live_allocations_become_series() {
    let devices = [
        device("GPU-0", 0, DeviceHealth::Healthy),
        device("GPU-1", 1, DeviceHealth::Unhealthy),
    ];
    let allocations = [
        allocation("a", "uid-a", 1000, Some(AllocationPhase::Allocated)),
        allocation("b", "uid-b", 3000, None),
        allocation("gone", "uid-c", 5000, Some(AllocationPhase::Released)),
    ];
    let mut usage = Usage::new();
    usage.insert(("uid-a_main".into(), 0), reading(512 << 20));
    let text = render(&scrape(&devices, &allocations, &usage));
    let gpu0 = r#"node="n1",uuid="GPU-0",index="0",model="NVIDIA A100-SXM4-80GB""#;
    let gpu1 = r#"node="n1",uuid="GPU-1",index="1",model="NVIDIA A100-SXM4-80GB""#;
    for line in [
        format!("tessera_gpu_memory_total_bytes{{{gpu0}}} {}", 81_920i64 << 20),
        format!("tessera_gpu_memory_allocated_bytes{{{gpu0}}} {}", 4000i64 << 20),
        format!("tessera_gpu_cores_allocated_percent{{{gpu0}}} 60"),
        format!("tessera_gpu_slices_allocated{{{gpu0}}} 2"),
        format!("tessera_gpu_memory_allocated_bytes{{{gpu1}}} 0"),
        format!("tessera_gpu_healthy{{{gpu0}}} 1"),
        format!("tessera_gpu_healthy{{{gpu1}}} 0"),
        format!(
            r#"hami_vgpu_memory_limit_bytes{{container="main",device_uuid="GPU-0",namespace="ml",pod="b",vdevice_index="0",zone="vGPU"}} {}"#,
            3000i64 << 20
        ),
        r#"tessera_container_core_limit_percent{namespace="ml",pod="a",container="main",uuid="GPU-0",device_index="0"} 30"#.to_owned(),
        r#"hami_vgpu_core_limit_percent{container="main",device_uuid="GPU-0",namespace="ml",pod="a",vdevice_index="0",zone="vGPU"} 30"#.to_owned(),
        format!(
            r#"tessera_container_memory_used_bytes{{namespace="ml",pod="a",container="main",uuid="GPU-0",device_index="0"}} {}"#,
            512i64 << 20
        ),
        format!(
            r#"hami_vgpu_memory_used_bytes{{container="main",device_uuid="GPU-0",namespace="ml",pod="a",vdevice_index="0",zone="vGPU"}} {}"#,
            512i64 << 20
        ),
    ] {
        assert!(has(&text, &line), "missing {line}\n{text}");
    }
    assert!(
        !text.contains(r#"pod="gone""#),
        "released allocations export nothing"
    );
    assert!(
        !text.contains(r#"tessera_container_memory_used_bytes{namespace="ml",pod="b""#),
        "no usage is invented before the container's first CUDA call"
    );
    for absent in [
        "hami_vgpu_core_used_percent{",
        "tessera_container_core_used_percent{",
        "hami_host_gpu_memory_used_bytes",
        "hami_container_last_kernel_elapsed_seconds{",
        "vGPU_device_memory_limit_in_bytes",
    ] {
        assert!(
            !text.contains(absent),
            "{absent}: not in HAMi, not measured (no compute use read yet), or legacy\n{text}"
        );
    }
}

#[test]
fn region_usage_is_a_claim_clamped_to_the_limit_and_refusals_are_counted() {
    let devices = [device("GPU-0", 0, DeviceHealth::Healthy)];
    let allocations = [allocation("a", "uid-a", 1000, None)];
    let mut usage = Usage::new();
    usage.insert(("uid-a_main".into(), 0), reading(u64::MAX));
    let refused = std::collections::HashMap::from([("uid-a_main".to_owned(), 7)]);
    let text = render(&Scrape {
        refused: &refused,
        ..scrape(&devices, &allocations, &usage)
    });
    let labels = r#"namespace="ml",pod="a",container="main",uuid="GPU-0",device_index="0""#;
    for line in [
        format!(
            "tessera_container_memory_used_bytes{{{labels}}} {}",
            1000i64 << 20
        ),
        format!("tessera_container_region_refused_total{{{labels}}} 7"),
        format!(
            r#"hami_vgpu_memory_used_bytes{{container="main",device_uuid="GPU-0",namespace="ml",pod="a",vdevice_index="0",zone="vGPU"}} {}"#,
            1000i64 << 20
        ),
    ] {
        assert!(has(&text, &line), "missing {line}\n{text}");
    }
}

#[test]
fn usage_is_read_from_the_containers_regions() {
    use tessera_vgpu_region::{MAX_DEVICES, Region};
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("uid-a_main");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(root.path().join("uid-b_main")).unwrap(); // no region yet
    let mut limits = [0u64; MAX_DEVICES];
    limits[0] = 1 << 30;
    let (region, _) = Region::create_or_open(&dir.join(REGION_FILE), &limits).unwrap();
    let me = std::process::id();
    let slot = region
        .claim_slot(me, tessera_vgpu_region::process_start_time(me).unwrap_or(0))
        .unwrap();
    region.try_reserve(slot, 0, 300 << 20).unwrap();
    let before = tessera_vgpu_region::priority::monotonic_now();
    region.record_launch(slot, 1, before);
    region.record_compute(1, 7_000_000, 1_000);
    let usage = read_usage(root.path());
    assert_eq!(
        usage.get(&("uid-a_main".into(), 0)),
        Some(&reading(300 << 20)),
        "no launch on ordinal 0"
    );
    assert_eq!(
        usage.get(&("uid-a_main".into(), 1)),
        Some(&Reading {
            used: 0,
            launched_at: Some(before),
            busy_ns: 7_000_000,
        })
    );
    assert!(!usage.keys().any(|(dir, _)| dir == "uid-b_main"));
}

#[test]
fn only_old_region_directories_of_pods_that_are_gone_are_stale() {
    let root = tempfile::tempdir().unwrap();
    for dir in [
        "live-uid_main",
        "gone-uid_main",
        "gone-uid_sidecar",
        "fresh-uid_main",
    ] {
        std::fs::create_dir_all(root.path().join(dir)).unwrap();
    }
    let old = std::time::SystemTime::now() - REGION_GRACE - std::time::Duration::from_secs(1);
    for dir in ["live-uid_main", "gone-uid_main", "gone-uid_sidecar"] {
        let file = std::fs::File::open(root.path().join(dir)).unwrap();
        file.set_modified(old).unwrap();
    }
    let live = ["live-uid".to_owned()].into_iter().collect();
    let mut stale: Vec<String> = stale_regions(root.path(), &live)
        .into_iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    stale.sort();
    assert_eq!(stale, ["gone-uid_main", "gone-uid_sidecar"]);
}

#[test]
fn a_gpu_is_shared_when_two_live_allocations_hold_it() {
    let mut other_gpu = allocation("c", "uid-c", 100, None);
    other_gpu.spec.containers[0].devices[0].uuid = "GPU-1".into();
    let marks = sharing_marks(&[
        allocation("a", "uid-a", 100, Some(AllocationPhase::Allocated)),
        allocation("b", "uid-b", 100, None),
        allocation("gone", "uid-gone", 100, Some(AllocationPhase::Released)),
        other_gpu,
    ]);
    assert_eq!(marks["uid-a_main"], [true]);
    assert_eq!(marks["uid-b_main"], [true]);
    assert_eq!(marks["uid-c_main"], [false], "alone on GPU-1");
    assert!(!marks.contains_key("uid-gone_main"));

    let alone = sharing_marks(&[allocation("a", "uid-a", 100, None)]);
    assert_eq!(alone["uid-a_main"], [false]);
}

mod hostile {
    //! The agent against containers that attack their region directory.

    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use tessera_vgpu_region::{MAX_DEVICES, REGION_SIZE, Region, Sharing};

    use super::*;
    use crate::monitor::arbiter::{self, Container};

    /// The warnings logged on this thread while `f` runs.
    fn warnings<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = tracing::subscriber::with_default(Warnings(seen.clone()), f);
        let seen = seen.lock().unwrap().clone();
        (out, seen)
    }

    /// A subscriber keeping the fields of every warning as one line.
    struct Warnings(Arc<Mutex<Vec<String>>>);

    struct Line(String);

    impl tracing::field::Visit for Line {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={value:?} ", field.name()));
        }
    }

    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::WARN {
                let mut line = Line(String::new());
                event.record(&mut line);
                self.0.lock().unwrap().push(line.0);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    fn valid_region(dir: &Path) -> Region {
        std::fs::create_dir_all(dir).unwrap();
        let mut limits = [0u64; MAX_DEVICES];
        limits[0] = 1 << 30;
        let (region, _) = Region::create_or_open(&dir.join(REGION_FILE), &limits).unwrap();
        let me = std::process::id();
        let start = tessera_vgpu_region::process_start_time(me).unwrap_or(0);
        let slot = region.claim_slot(me, start).unwrap();
        region.try_reserve(slot, 0, 100 << 20).unwrap();
        region
    }

    fn valid_bytes() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        drop(valid_region(dir.path()));
        std::fs::read(dir.path().join(REGION_FILE)).unwrap()
    }

    /// Puts one attack in place at a region's path.
    type Attack<'a> = Box<dyn Fn(&Path) + 'a>;

    /// Every attack on a region directory the issue lists, one container
    /// each; returns the directory names and the host file the links point at.
    fn attacks(root: &Path) -> (Vec<&'static str>, PathBuf) {
        let host = root.parent().unwrap().join("host-file");
        std::fs::write(&host, valid_bytes()).unwrap();
        let mut absurd = valid_bytes();
        absurd[24..28].copy_from_slice(&u32::MAX.to_ne_bytes()); // slot_count
        let attacks: [(&str, Attack<'_>); 8] = [
            ("symlink_main", Box::new(|p| symlink(&host, p).unwrap())),
            (
                "hardlink_main",
                Box::new(|p| std::fs::hard_link(&host, p).unwrap()),
            ),
            (
                "directory_main",
                Box::new(|p| std::fs::create_dir(p).unwrap()),
            ),
            (
                "fifo_main",
                Box::new(|p| {
                    let made = std::process::Command::new("mkfifo").arg(p).status();
                    assert!(made.unwrap().success());
                }),
            ),
            (
                "sparse_main",
                Box::new(|p| std::fs::File::create(p).unwrap().set_len(8 << 30).unwrap()),
            ),
            (
                "random_main",
                Box::new(|p| {
                    let noise: Vec<u8> = (0..REGION_SIZE).map(|i| (i * 131 + 7) as u8).collect();
                    std::fs::write(p, noise).unwrap()
                }),
            ),
            (
                "absurd_main",
                Box::new(move |p| std::fs::write(p, &absurd).unwrap()),
            ),
            (
                "truncated_main",
                Box::new(|p| std::fs::write(p, &valid_bytes()[..4096]).unwrap()),
            ),
        ];
        let mut names = Vec::new();
        for (name, attack) in attacks {
            std::fs::create_dir_all(root.join(name)).unwrap();
            attack(&root.join(name).join(REGION_FILE));
            names.push(name);
        }
        (names, host)
    }

    #[test]
    fn every_attack_is_refused_with_one_warning_and_the_others_are_still_served() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("containers");
        std::fs::create_dir(&root).unwrap();
        let (names, host) = attacks(&root);
        let host_before = std::fs::read(&host).unwrap();
        let good = valid_region(&root.join("good_main"));
        let everyone: Vec<String> = names
            .iter()
            .map(|n| n.to_string())
            .chain(["good_main".to_owned()])
            .collect();
        let containers: BTreeMap<String, Container> = everyone
            .iter()
            .map(|d| {
                let container = Container {
                    priority: tessera_vgpu_region::Priority::Low,
                    gpus: vec![Some("GPU-0".to_owned())],
                };
                (d.clone(), container)
            })
            .collect();

        let started = Instant::now();
        let (usage, logged) = warnings(|| {
            let mut usage = Usage::new();
            for _ in 0..3 {
                usage = read_usage(&root);
                let marks = everyone.iter().map(|d| (d.clone(), vec![true])).collect();
                write_sharing(&root, marks);
                arbiter::arbitrate_once(&root, &containers);
            }
            usage
        });
        assert!(started.elapsed() < Duration::from_secs(5), "nothing blocks");

        assert_eq!(
            usage.get(&("good_main".into(), 0)).map(|r| r.used),
            Some(100 << 20)
        );
        assert!(
            usage.keys().all(|(dir, _)| dir == "good_main"),
            "{:?}",
            usage.keys()
        );
        assert_eq!(
            good.sharing(0),
            Sharing::Shared,
            "the good one is still served"
        );
        for name in &names {
            let about: Vec<&String> = logged.iter().filter(|l| l.contains(name)).collect();
            assert_eq!(about.len(), 1, "one warning for {name}: {logged:#?}");
            assert!(about[0].contains("shared region"), "{}", about[0]);
        }
        assert!(
            !logged.iter().any(|l| l.contains("good_main")),
            "{logged:#?}"
        );
        let refusals = regions::refusals(&root);
        for name in &names {
            assert!(refusals.get(*name).is_some_and(|&n| n >= 3), "{refusals:?}");
        }
        assert_eq!(
            std::fs::read(&host).unwrap(),
            host_before,
            "nothing written through links"
        );
        let sparse = std::fs::metadata(root.join("sparse_main").join(REGION_FILE)).unwrap();
        assert_eq!(sparse.len(), 8 << 30);
    }

    #[test]
    fn a_region_before_the_first_cuda_call_is_not_an_offence_but_going_back_to_it_is() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path();
        std::fs::create_dir(root.join("new_main")).unwrap();
        let (_, quiet) = warnings(|| {
            read_usage(root);
            std::fs::File::create(root.join("new_main").join(REGION_FILE)).unwrap();
            read_usage(root);
        });
        assert!(quiet.is_empty(), "{quiet:?}");
        drop(valid_region(&root.join("new_main")));
        let (usage, _) = warnings(|| read_usage(root));
        assert!(usage.contains_key(&("new_main".into(), 0)));
        std::fs::File::create(root.join("new_main").join(REGION_FILE)).unwrap();
        let (usage, logged) = warnings(|| read_usage(root));
        assert!(usage.is_empty());
        assert_eq!(logged.len(), 1, "{logged:?}");
    }

    #[test]
    fn a_region_truncated_and_restored_in_a_loop_never_kills_the_agent() {
        // The measured failure: a pod copied its region, then in a loop
        // restored and truncated it; the agent, which mapped the region,
        // died of SIGBUS within seconds. Here every agent path races the
        // same loop in this process: a SIGBUS kills the test binary.
        let base = tempfile::tempdir().unwrap();
        let root = base.path().to_owned();
        let dir = root.join("attacker_main");
        drop(valid_region(&dir));
        let path = dir.join(REGION_FILE);
        let copy = std::fs::read(&path).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let attacker = {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    std::fs::write(&path, &copy).unwrap();
                    std::fs::File::create(&path).unwrap(); // truncate to 0
                    rounds += 1;
                }
                rounds
            })
        };
        let containers = BTreeMap::from([(
            "attacker_main".to_owned(),
            Container {
                priority: tessera_vgpu_region::Priority::Low,
                gpus: vec![Some("GPU-0".to_owned())],
            },
        )]);
        let proc_root = Path::new("/proc");
        let pids = arbiter::host_pids(proc_root);
        let until = Instant::now() + Duration::from_millis(1500);
        let mut passes = 0;
        let (_, logged) = warnings(|| {
            while Instant::now() < until {
                read_usage(&root);
                write_sharing(
                    &root,
                    BTreeMap::from([("attacker_main".to_owned(), vec![true])]),
                );
                arbiter::arbitrate_once(&root, &containers);
                arbiter::fill_host_pids(&root, ["attacker_main".to_owned()], &pids, proc_root);
                passes += 1;
            }
        });
        stop.store(true, Ordering::Relaxed);
        let rounds = attacker.join().unwrap();
        assert!(
            passes > 10 && rounds > 10,
            "passes {passes}, rounds {rounds}"
        );
        assert!(logged.len() <= 1, "rate-limited: {logged:#?}");
    }
}

#[test]
fn compute_use_is_exported_where_the_interposer_limits_compute() {
    use tessera_api::v1alpha1::CorePolicy;
    let devices = [
        device("GPU-0", 0, DeviceHealth::Healthy),
        device("GPU-1", 1, DeviceHealth::Healthy),
    ];
    let on = |pod: &str, uid: &str, gpu: &str, cores: u32| {
        testing::allocation(pod, uid, "n1")
            .namespace("ml")
            .container(testing::container(
                "main",
                vec![testing::slice(gpu, 0, 1000, cores)],
            ))
            .build()
    };
    // a and b share GPU-0 (30 % each); c is alone on GPU-1 (40 %); d holds
    // GPU-0 with no compute limit.
    let allocations = [
        on("a", "uid-a", "GPU-0", 30),
        on("b", "uid-b", "GPU-0", 30),
        on("c", "uid-c", "GPU-1", 40),
        on("d", "uid-d", "GPU-0", 0),
    ];
    let usage: Usage = ["uid-a_main", "uid-b_main", "uid-c_main", "uid-d_main"]
        .into_iter()
        .map(|dir| ((dir.to_owned(), 0), reading(0)))
        .collect();
    let core_use: cores::CoreUse = [("uid-a_main", 29), ("uid-c_main", 41), ("uid-d_main", 0)]
        .into_iter()
        .map(|(dir, percent)| ((dir.to_owned(), 0), percent))
        .collect();
    let hami = |pod: &str, gpu: &str| {
        format!(
            r#"{{container="main",device_uuid="{gpu}",namespace="ml",pod="{pod}",vdevice_index="0",zone="vGPU"}}"#
        )
    };
    let render_with = |policy| {
        render(&Scrape {
            core_use: &core_use,
            core_policy: policy,
            ..scrape(&devices, &allocations, &usage)
        })
    };

    let text = render_with(CorePolicy::Default);
    for line in [
        format!("hami_vgpu_core_used_percent{} 29", hami("a", "GPU-0")),
        format!("hami_vgpu_core_limit_percent{} 30", hami("a", "GPU-0")),
        format!("hami_vgpu_core_limit_percent{} 40", hami("c", "GPU-1")),
        // No compute limit is every SM, as HAMi reads a limit of 0.
        format!("hami_vgpu_core_limit_percent{} 100", hami("d", "GPU-0")),
        r#"tessera_container_core_used_percent{namespace="ml",pod="a",container="main",uuid="GPU-0",device_index="0"} 29"#.to_owned(),
    ] {
        assert!(has(&text, &line), "missing {line}\n{text}");
    }
    for absent in [
        // b's rate is not known yet; c is alone on its GPU, so `default`
        // does not limit it and nothing measures it; d has no limit.
        format!("hami_vgpu_core_used_percent{}", hami("b", "GPU-0")),
        format!("hami_vgpu_core_used_percent{}", hami("c", "GPU-1")),
        format!("hami_vgpu_core_used_percent{}", hami("d", "GPU-0")),
    ] {
        assert!(!text.contains(&absent), "{absent} is not measured\n{text}");
    }

    let text = render_with(CorePolicy::Force);
    let line = format!("hami_vgpu_core_used_percent{} 41", hami("c", "GPU-1"));
    assert!(has(&text, &line), "force limits c alone too\n{text}");

    let text = render_with(CorePolicy::Disable);
    assert!(
        !text.contains("hami_vgpu_core_used_percent{"),
        "disable limits (and measures) nothing\n{text}"
    );
    assert!(has(
        &text,
        &format!("hami_vgpu_core_limit_percent{} 30", hami("a", "GPU-0"))
    ));
}
