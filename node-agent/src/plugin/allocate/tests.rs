use std::collections::BTreeMap;

use pretty_assertions::assert_eq;
use tessera_api::{
    testing,
    v1alpha1::{CorePolicy, DeviceSlice},
};

use super::*;
use crate::{mps, plugin::ids::replica_id, sharing::hami_core};

const NODE: &str = "node-1";

fn paths() -> HostPaths {
    HostPaths {
        library: "/opt/tessera/libtessera_vgpu.so".into(),
        preload: "/var/lib/tessera/ld.so.preload".into(),
        regions: "/var/lib/tessera/containers".into(),
        limits: "/var/lib/tessera/limits".into(),
    }
}

fn lock(uid: &str) -> NodeLock {
    crate::plugin::test_lock(NODE, &testing::pod_ref("ml", "train", uid), "train")
}

fn slice(uuid: &str, mib: u64, cores: u32) -> DeviceSlice {
    testing::slice(uuid, 0, mib, cores)
}

fn allocation(containers: Vec<(&str, Vec<DeviceSlice>)>, served: &[&str]) -> VgpuAllocation {
    testing::allocation("train", "uid-1", NODE)
        .namespace("ml")
        .containers(
            containers
                .into_iter()
                .map(|(name, devices)| testing::container(name, devices)),
        )
        .served(served)
        .build()
}

fn ids(uuids: &[&str]) -> Vec<String> {
    uuids.iter().map(|u| replica_id(u, 7)).collect()
}

/// The container the kubelet asks for with `request` (device IDs of these
/// GPUs), of `allocation`, whose pod holds the lock.
fn serve(allocation: &VgpuAllocation, request: &[&str]) -> Result<Grant, AllocateError> {
    grant(
        NODE,
        Some(&lock("uid-1")),
        Some(allocation),
        &ids(request),
        &paths(),
    )
}

/// The device plugin's answer for a hami-core `grant` under `settings`.
fn answered(
    grant: &Grant,
    settings: &NodeSettings,
    list: &DeviceList,
) -> ContainerAllocateResponse {
    let contract = hami_core::contract(&grant.to_serve(settings), &paths());
    answer(contract, list, &grant.pod_uid)
}

fn envs_of(answer: &ContainerAllocateResponse) -> BTreeMap<&str, &str> {
    answer
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[test]
fn one_container_gets_its_devices_limits_and_mounts() {
    let allocation = allocation(vec![("main", vec![slice("GPU-a", 3000, 30)])], &[]);
    let grant = serve(&allocation, &["GPU-a"]).unwrap();
    let answer = answered(&grant, &NodeSettings::default(), &DeviceList::default());
    let envs = envs_of(&answer);
    let env = |k: &str| envs.get(k).copied();
    assert_eq!(env("NVIDIA_VISIBLE_DEVICES"), Some("GPU-a"));
    assert_eq!(env("CUDA_DEVICE_MEMORY_LIMIT_0"), Some("3000m"));
    assert_eq!(env("CUDA_DEVICE_SM_LIMIT"), Some("30"));
    assert_eq!(
        env("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
        Some("/var/run/tessera/vgpu/region")
    );
    assert_eq!(env("GPU_CORE_UTILIZATION_POLICY"), Some("default"));
    assert_eq!(env("LIBCUDA_LOG_LEVEL"), Some("2"));
    assert_eq!(env("CUDA_OVERSUBSCRIBE"), None);
    assert_eq!(grant.container, "main");
    assert!(grant.last);
    assert!(grant.mismatched.is_empty());
    assert_eq!(
        grant.region_dir,
        PathBuf::from("/var/lib/tessera/containers/uid-1_main")
    );
    let mounts: Vec<(&str, bool)> = answer
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/usr/local/vgpu/libtessera_vgpu.so", true),
            ("/etc/ld.so.preload", true),
            ("/var/run/tessera/vgpu", false),
            ("/var/run/tessera/limits", true)
        ]
    );
    assert_eq!(
        answer.mounts[3].host_path,
        "/var/lib/tessera/limits/uid-1_main"
    );
}

#[test]
fn containers_are_served_in_order_and_gpu_less_ones_skipped() {
    let allocation_with = |served: &[&str]| {
        allocation(
            vec![
                ("init", vec![slice("GPU-a", 1000, 0)]),
                ("sidecar", vec![]),
                (
                    "main",
                    vec![slice("GPU-a", 2000, 0), slice("GPU-b", 2000, 0)],
                ),
            ],
            served,
        )
    };
    let after = |served: &[&str], request: &[&str]| serve(&allocation_with(served), request);
    let first = after(&[], &["GPU-a"]).unwrap();
    assert_eq!((first.container.as_str(), first.last), ("init", false));
    let second = after(&["init"], &["GPU-a", "GPU-b"]).unwrap();
    assert_eq!((second.container.as_str(), second.last), ("main", true));
    let answer = answered(&second, &NodeSettings::default(), &DeviceList::default());
    let envs = envs_of(&answer);
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    assert_eq!(envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "2000m");
    assert_eq!(envs["CUDA_DEVICE_SM_LIMIT"], "0");
    let again = after(&["init", "main"], &["GPU-a"]).unwrap_err();
    let said = again.to_string();
    assert!(
        said.starts_with(
            "the NodeLock is free: its last holder, pod ml/train, was served (init, main), and no GPU pod is waiting for devices here."
        ),
        "{said}"
    );
}

#[test]
fn settings_reach_the_environment() {
    let allocation = allocation(vec![("main", vec![slice("GPU-a", 100, 10)])], &[]);
    let settings = NodeSettings {
        gpu_core_policy: CorePolicy::Force,
        lib_cuda_log_level: 4,
        device_memory_scaling: 2.0,
        ..NodeSettings::default()
    };
    let grant = serve(&allocation, &["GPU-a"]).unwrap();
    let answer = answered(&grant, &settings, &DeviceList::default());
    let envs = envs_of(&answer);
    assert_eq!(envs["GPU_CORE_UTILIZATION_POLICY"], "force");
    assert_eq!(envs["LIBCUDA_LOG_LEVEL"], "4");
    assert_eq!(envs["CUDA_OVERSUBSCRIBE"], "true");
}

#[test]
fn the_allocation_decides_even_when_the_kubelet_picked_other_gpus() {
    let allocation = allocation(vec![("main", vec![slice("GPU-a", 100, 10)])], &[]);
    let grant = serve(&allocation, &["GPU-z"]).unwrap();
    let answer = answered(&grant, &NodeSettings::default(), &DeviceList::default());
    assert_eq!(envs_of(&answer)["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
    assert_eq!(grant.mismatched, ["GPU-z"]);
}

#[test]
fn refusals_say_what_is_wrong() {
    let ok = allocation(vec![("main", vec![slice("GPU-a", 100, 10)])], &[]);
    let mut other_node = ok.clone();
    other_node.spec.node_name = "node-2".into();
    type Case = (
        Option<NodeLock>,
        Option<VgpuAllocation>,
        Vec<String>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            None,
            Some(ok.clone()),
            ids(&["GPU-a"]),
            "node node-1 has no NodeLock",
        ),
        (
            Some(lock("uid-1")),
            None,
            ids(&["GPU-a"]),
            "NodeLock node-1 names pod ml/train but its VgpuAllocation train does not exist (yet)",
        ),
        (
            Some(lock("uid-2")),
            Some(ok.clone()),
            ids(&["GPU-a"]),
            "belongs to pod UID uid-1, not the holder's uid-2",
        ),
        (
            Some(lock("uid-1")),
            Some(other_node),
            ids(&["GPU-a"]),
            "train is for node node-2",
        ),
        (
            Some(lock("uid-1")),
            Some(ok),
            ids(&["GPU-a", "GPU-b"]),
            "pod ml/train container main: the kubelet asks for 2 device(s) but the allocation holds 1",
        ),
    ];
    for (lock, allocation, request, needle) in cases {
        let error = grant(NODE, lock.as_ref(), allocation.as_ref(), &request, &paths())
            .unwrap_err()
            .to_string();
        assert!(error.contains(needle), "{needle:?} not in {error:?}");
    }
}

#[test]
fn preferred_steers_to_the_allocated_gpus() {
    let allocation = allocation(
        vec![(
            "main",
            vec![slice("GPU-b", 100, 10), slice("GPU-c", 100, 10)],
        )],
        &[],
    );
    let available: Vec<String> = ["GPU-a", "GPU-b", "GPU-c"]
        .iter()
        .flat_map(|u| (0..3).map(move |r| replica_id(u, r)))
        .collect();
    let holder = lock("uid-1");
    assert_eq!(
        preferred(Some(&holder), Some(&allocation), &available, &[], 2),
        Some(vec!["GPU-b::0".to_owned(), "GPU-c::0".to_owned()])
    );
    assert_eq!(
        preferred(Some(&holder), Some(&allocation), &available[..3], &[], 2),
        None,
        "GPU-b and GPU-c have no free replica: let the kubelet choose"
    );
    assert_eq!(preferred(None, Some(&allocation), &available, &[], 2), None);
    assert_eq!(
        preferred(Some(&lock("other")), Some(&allocation), &available, &[], 2),
        None
    );
}

#[test]
fn the_containers_priority_reaches_the_interposer() {
    let mut allocation = allocation(vec![("main", vec![slice("GPU-a", 3000, 30)])], &[]);
    let priority = |allocation: &VgpuAllocation| {
        let grant = serve(allocation, &["GPU-a"]).unwrap();
        let answer = answered(&grant, &NodeSettings::default(), &DeviceList::default());
        answer.envs.get("CUDA_TASK_PRIORITY").cloned()
    };
    assert_eq!(priority(&allocation), None, "low unless asked");
    allocation.spec.containers[0].priority = Some(0);
    assert_eq!(priority(&allocation).as_deref(), Some("0"));
}

#[test]
fn each_device_list_strategy_shapes_the_answer() {
    use crate::plugin::DeviceListStrategy::{CdiAnnotations, CdiCri, Envvar};
    let allocation = allocation(
        vec![(
            "main",
            vec![slice("GPU-a", 100, 10), slice("GPU-b", 100, 10)],
        )],
        &[],
    );
    let answer = |strategies: &[crate::plugin::DeviceListStrategy], kind: &str, prefix: &str| {
        let list = DeviceList {
            strategies: strategies.to_vec(),
            cdi_kind: kind.to_owned(),
            cdi_annotation_prefix: prefix.to_owned(),
        };
        let grant = serve(&allocation, &["GPU-a", "GPU-b"]).unwrap();
        answered(&grant, &NodeSettings::default(), &list)
    };

    let envvar = answer(&[Envvar], "nvidia.com/gpu", "cdi.k8s.io/");
    assert_eq!(envvar.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    assert!(envvar.cdi_devices.is_empty());
    assert!(envvar.annotations.is_empty());

    let cri = answer(&[CdiCri], "nvidia.com/gpu", "cdi.k8s.io/");
    let names: Vec<&str> = cri.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]);
    assert_eq!(
        cri.envs.get("NVIDIA_VISIBLE_DEVICES"),
        None,
        "as NVIDIA's plugin: no envvar without the envvar strategy"
    );
    assert!(cri.annotations.is_empty());
    assert_eq!(
        cri.envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "100m",
        "limits stay"
    );
    assert_eq!(
        cri.mounts.len(),
        4,
        "the interposer is mounted all the same"
    );

    let annotated = answer(
        &[CdiAnnotations],
        "k8s.device-plugin.nvidia.com/gpu",
        "nvidia.cdi.k8s.io/",
    );
    assert_eq!(
        annotated
            .annotations
            .clone()
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
        BTreeMap::from([(
            "nvidia.cdi.k8s.io/tessera-node-agent_uid-1".to_owned(),
            "k8s.device-plugin.nvidia.com/gpu=GPU-a,k8s.device-plugin.nvidia.com/gpu=GPU-b"
                .to_owned()
        )])
    );
    assert!(annotated.cdi_devices.is_empty());
    assert_eq!(annotated.envs.get("NVIDIA_VISIBLE_DEVICES"), None);

    let all = answer(
        &[Envvar, CdiCri, CdiAnnotations],
        "nvidia.com/gpu",
        "cdi.k8s.io/",
    );
    assert_eq!(all.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    assert_eq!(all.cdi_devices.len(), 2);
    assert_eq!(all.annotations.len(), 1);
}

#[test]
fn an_mps_container_gets_its_share_as_client_settings_and_no_interposer() {
    let daemon = crate::mps::MpsDaemon {
        uuid: "GPU-a".into(),
        pipe_dir: "/var/lib/tessera/mps/GPU-a/pipe".into(),
        log_dir: "/var/lib/tessera/mps/GPU-a/log".into(),
        shm_dir: "/var/lib/tessera/mps/shm".into(),
    };
    let share = |memory: u64, cores: u32| {
        let (envs, mounts) = mps::client_share(&daemon, memory, cores);
        let contract = Contract {
            visible: vec!["GPU-a".into()],
            envs,
            mounts,
            ..Contract::default()
        };
        answer(contract, &DeviceList::default(), "uid")
    };
    let answer = share(8000, 30);
    assert_eq!(
        envs_of(&answer).into_iter().collect::<Vec<_>>(),
        [
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30"),
            ("CUDA_MPS_LOG_DIRECTORY", mps::CONTAINER_LOG_DIR),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=8000M"),
            ("CUDA_MPS_PIPE_DIRECTORY", mps::CONTAINER_PIPE_DIR),
            ("NVIDIA_VISIBLE_DEVICES", "GPU-a"),
        ]
    );
    let mounts: Vec<(&str, bool)> = answer
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            (mps::CONTAINER_PIPE_DIR, true),
            (mps::CONTAINER_LOG_DIR, true),
            ("/dev/shm", false)
        ]
    );
    assert_eq!(
        answer.mounts[0].host_path,
        daemon.pipe_dir.display().to_string()
    );
    // All of the GPU's SMs: no thread percentage.
    assert!(
        !share(81559, 100)
            .envs
            .contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    );
    assert!(
        !share(81559, 0)
            .envs
            .contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    );
}

#[test]
fn a_container_is_served_in_the_mode_of_its_slices_and_its_node() {
    use crate::sharing::Mode;
    use tessera_api::v1alpha1::{MigPlacement, MigSlice, MigStrategy, OperatingMode};
    let node = |operating_mode, mig_strategy| NodeSettings {
        operating_mode,
        mig_strategy,
        ..NodeSettings::default()
    };
    let plain = [slice("GPU-a", 100, 10)];
    let mut cut = slice("GPU-a", 100, 10);
    cut.mig = Some(MigSlice {
        profile: "1g.10gb".into(),
        placement: MigPlacement { start: 0, size: 1 },
    });
    use MigStrategy::{Mixed, None as Dynamic, Single};
    use OperatingMode::{HamiCore, Mig, Mps};
    let cases = [
        (&plain[..], node(HamiCore, Dynamic), Mode::HamiCore),
        (&plain[..], node(Mps, Dynamic), Mode::Mps),
        (&plain[..], node(Mig, Single), Mode::HamiCore),
        (&[cut.clone()][..], node(Mig, Dynamic), Mode::DynamicMig),
        // Cut at Bind, before the node left dynamic MIG: still instances.
        (&[cut][..], node(HamiCore, Mixed), Mode::DynamicMig),
    ];
    for (slices, settings, mode) in cases {
        assert_eq!(Mode::of_container(slices, &settings), mode, "{settings:?}");
    }
    assert_eq!(Mode::of(&node(Mig, Mixed)), Mode::StaticMig);
    assert_eq!(Mode::of(&node(Mig, Single)), Mode::MigSingle);
}

#[test]
fn the_answer_carries_cdi_devices_and_annotations() {
    use crate::plugin::DeviceListStrategy::{CdiAnnotations, CdiCri};
    let contract = Contract {
        visible: vec!["GPU-a".into()],
        envs: BTreeMap::from([("CUDA_DEVICE_SM_LIMIT".into(), "30".into())]),
        ..Contract::default()
    };
    let list = DeviceList {
        strategies: vec![CdiCri, CdiAnnotations],
        ..DeviceList::default()
    };
    let answer = answer(contract, &list, "uid-1");
    assert_eq!(answer.envs["CUDA_DEVICE_SM_LIMIT"], "30");
    assert_eq!(
        answer.annotations["cdi.k8s.io/tessera-node-agent_uid-1"],
        "nvidia.com/gpu=GPU-a"
    );
    assert_eq!(
        answer.cdi_devices,
        [CdiDevice {
            name: "nvidia.com/gpu=GPU-a".into()
        }]
    );
}

#[test]
fn a_served_container_is_recorded_once_and_a_released_allocation_never_comes_back() {
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
    let two = vec![
        ("init", vec![slice("GPU-a", 1024, 10)]),
        ("main", vec![slice("GPU-a", 2048, 20)]),
    ];
    let made = [ServedMigInstance {
        container: "init".into(),
        gpu: "GPU-a".into(),
        uuid: "MIG-1".into(),
    }];
    // The first of two containers: listed, not yet Allocated.
    let fresh = allocation(two.clone(), &[]);
    let first = serve(&fresh, &["GPU-a"]).unwrap();
    let status = served_status(&fresh, &first, &made, now.clone()).unwrap();
    assert_eq!(status.served_containers, ["init"]);
    assert_eq!(status.mig_instances, made);
    assert_eq!((status.phase, status.allocated_at), (None, None));
    // The last one: Allocated at `now`, the earlier container kept.
    let half = allocation(two.clone(), &["init"]);
    let last = serve(&half, &["GPU-a"]).unwrap();
    let status = served_status(&half, &last, &[], now.clone()).unwrap();
    assert_eq!(status.served_containers, ["init", "main"]);
    assert_eq!(status.phase, Some(AllocationPhase::Allocated));
    assert_eq!(status.allocated_at, Some(now.clone()));
    // A retry after an attempt got through writes nothing.
    let whole = allocation(two.clone(), &["init", "main"]);
    assert_eq!(served_status(&whole, &last, &[], now.clone()), None);
    // Released while the write was retried (the pod was deleted): its
    // slices may be another pod's by now, so it is never marked Allocated.
    let mut released = allocation(two, &["init"]);
    released.status.get_or_insert_with(Default::default).phase = Some(AllocationPhase::Released);
    assert_eq!(served_status(&released, &last, &[], now), None);
}
