use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::v1alpha1::{
    AllocationTotals, ContainerAllocation, DeviceCapacity, DeviceHealth, DeviceSlice, GpuDevice,
    SchedulingPolicy, VgpuAllocationSpec, VgpuAllocationStatus,
};

use super::*;

pub(super) fn device(uuid: &str, index: u32, health: DeviceHealth) -> GpuDevice {
    GpuDevice {
        uuid: uuid.into(),
        index,
        model: "NVIDIA A100-SXM4-80GB".into(),
        memory_mib: 81_920,
        capacity: DeviceCapacity {
            memory_mib: 81_920,
            cores: 100,
        },
        split_count: 10,
        health,
        ..Default::default()
    }
}

pub(super) fn allocation(
    pod: &str,
    uid: &str,
    mib: u64,
    phase: Option<AllocationPhase>,
) -> VgpuAllocation {
    let containers = vec![ContainerAllocation {
        priority: None,
        name: "main".into(),
        devices: vec![DeviceSlice {
            uuid: "GPU-0".into(),
            index: 0,
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: mib,
            cores: 30,
        }],
    }];
    let mut allocation = VgpuAllocation::new(
        pod,
        VgpuAllocationSpec {
            pod_name: pod.into(),
            pod_uid: uid.into(),
            node_name: "n1".into(),
            totals: AllocationTotals::of(&containers),
            containers,
            gpu_policy: SchedulingPolicy::Spread,
            node_policy: SchedulingPolicy::Binpack,
            trace_context: None,
        },
    );
    allocation.metadata = ObjectMeta {
        name: Some(pod.into()),
        namespace: Some("ml".into()),
        ..Default::default()
    };
    allocation.status = Some(VgpuAllocationStatus {
        phase,
        ..Default::default()
    });
    allocation
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

fn reading(used: u64) -> Reading {
    Reading {
        used,
        launched_at: None,
    }
}

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
        "hami_vgpu_core_limit_percent",
        "hami_host_gpu_memory_used_bytes",
        "hami_container_last_kernel_elapsed_seconds{",
        "vGPU_device_memory_limit_in_bytes",
    ] {
        assert!(
            !text.contains(absent),
            "{absent}: not in HAMi, not measured, or legacy\n{text}"
        );
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
            launched_at: Some(before)
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
