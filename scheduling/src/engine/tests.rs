//! One test per placement rule, plus a property test that no sequence of
//! placements and releases breaks invariant I1.

use crate::request::{ContainerKind, ContainerRequest, MemoryRequest, PodOptions, PodRequest};
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use tessera_api::v1alpha1::{OperatingMode, SchedulingPolicy};

use super::*;
use MemoryRequest::{Mib, Percent};
use SchedulingPolicy::{Binpack, Spread};

fn gpu(uuid: &str, model: &str, memory_mib: u64, numa: u32) -> GpuDevice {
    GpuDevice {
        cordoned: false,
        family: Default::default(),
        network_id: None,
        uuid: uuid.into(),
        index: uuid
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or(0),
        model: model.into(),
        memory_mib,
        cores: 100,
        split_count: 10,
        numa_node: Some(numa),
        healthy: true,
        mode: OperatingMode::HamiCore,
        mig: None,
        mig_present: 0,
        profiles: Vec::new(),
        minor: None,
        qos_policy: None,
    }
}

fn a100s(n: usize) -> NodeGpus {
    NodeGpus::new(
        (0..n)
            .map(|i| {
                gpu(
                    &format!("GPU-{i}"),
                    "NVIDIA A100-SXM4-80GB",
                    81920,
                    (i / 2) as u32,
                )
            })
            .collect(),
    )
}

fn container(name: &str, count: u32, memory: MemoryRequest, cores: u32) -> ContainerRequest {
    ContainerRequest {
        name: name.into(),
        kind: ContainerKind::App,
        count,
        memory,
        cores,
        priority: None,
        family: Default::default(),
        vendor: None,
    }
}

fn pod(containers: Vec<ContainerRequest>) -> PodRequest {
    PodRequest {
        containers,
        options: PodOptions::default(),
    }
}

fn one(count: u32, memory: MemoryRequest, cores: u32) -> PodRequest {
    pod(vec![container("main", count, memory, cores)])
}

/// UUIDs each container got.
fn uuids(node: &NodeGpus, placement: &Placement) -> Vec<Vec<String>> {
    placement
        .containers
        .iter()
        .map(|c| {
            c.slices
                .iter()
                .map(|s| node.devices[s.device].uuid.clone())
                .collect()
        })
        .collect()
}

fn place(
    node: &mut NodeGpus,
    request: &PodRequest,
    policy: SchedulingPolicy,
) -> Result<Vec<Vec<String>>, String> {
    let placement = fit(node, request, policy).map_err(|r| r.to_string())?;
    for slice in placement.slices() {
        node.charge(slice);
    }
    assert!(node.within_capacity());
    Ok(uuids(node, &placement))
}

#[test]
fn spread_takes_the_emptiest_gpu_and_binpack_the_fullest() {
    let mut node = a100s(3);
    place(&mut node, &one(1, Mib(40000), 10), Spread).unwrap(); // GPU-0
    assert_eq!(
        place(&mut node, &one(1, Mib(1000), 10), Spread).unwrap(),
        [["GPU-1"]]
    );
    assert_eq!(
        place(&mut node, &one(1, Mib(1000), 10), Binpack).unwrap(),
        [["GPU-0"]]
    );
}

#[test]
fn percentages_resolve_against_each_gpu() {
    let mut node = NodeGpus::new(vec![gpu("GPU-0", "A100", 81920, 0)]);
    place(&mut node, &one(1, Percent(50), 0), Spread).unwrap();
    place(&mut node, &one(1, Percent(50), 0), Spread).unwrap();
    assert_eq!(node.usage[0].memory_mib, 81920);
    let err = place(&mut node, &one(1, Percent(60), 0), Spread).unwrap_err();
    assert!(
        err.contains("1 GPU without 60% of memory free (largest free is 0 MiB on GPU-0)"),
        "{err}"
    );
}

#[test]
fn memory_shortage_names_the_largest_free_gpu() {
    let mut node = a100s(2);
    place(&mut node, &one(1, Mib(80000), 0), Spread).unwrap();
    place(&mut node, &one(1, Mib(75000), 0), Spread).unwrap();
    let err = place(&mut node, &one(1, Mib(8000), 30), Spread).unwrap_err();
    assert_eq!(
        err,
        "container \"main\" needs 1 GPU with 8000 MiB and 30 cores; 0 of 2 GPUs fit: \
         2 GPUs without 8000 MiB free (largest free is 6920 MiB on GPU-1)"
    );
}

#[test]
fn cores_are_bounded_by_capacity_and_scaling() {
    let mut node = NodeGpus::new(vec![gpu("GPU-0", "A100", 81920, 0)]);
    place(&mut node, &one(1, Mib(1000), 70), Spread).unwrap();
    let err = place(&mut node, &one(1, Mib(1000), 40), Spread).unwrap_err();
    assert!(
        err.contains("without 40 cores free (most free is 30 on GPU-0)"),
        "{err}"
    );
    node.devices[0].cores = 200; // core scaling 2
    place(&mut node, &one(1, Mib(1000), 40), Spread).unwrap();
}

#[test]
fn a_hundred_cores_takes_an_empty_gpu_and_keeps_it() {
    let mut node = a100s(2);
    place(&mut node, &one(1, Mib(1000), 10), Spread).unwrap(); // GPU-0
    assert_eq!(
        place(&mut node, &one(1, Percent(100), 100), Spread).unwrap(),
        [["GPU-1"]]
    );
    let err = place(&mut node, &one(1, Mib(1000), 100), Spread).unwrap_err();
    assert!(
        err.contains("1 GPU held exclusively by another container"),
        "{err}"
    );
    assert!(
        err.contains("1 GPU in use, but 100 cores needs an empty GPU"),
        "{err}"
    );
    let err = place(&mut node, &one(2, Mib(10), 0), Spread).unwrap_err();
    assert!(err.contains("1 of 2 GPUs fit"), "{err}");
}

#[test]
fn split_count_limits_slices() {
    let mut node = NodeGpus::new(vec![GpuDevice {
        family: Default::default(),
        network_id: None,
        split_count: 2,
        ..gpu("GPU-0", "A100", 81920, 0)
    }]);
    place(&mut node, &one(1, Mib(10), 0), Spread).unwrap();
    place(&mut node, &one(1, Mib(10), 0), Spread).unwrap();
    let err = place(&mut node, &one(1, Mib(10), 0), Spread).unwrap_err();
    assert!(err.ends_with("1 GPU with no free slice"), "{err}");
}

#[test]
fn several_gpus_per_container_are_distinct_and_containers_accumulate() {
    let mut node = a100s(4);
    let got = place(&mut node, &one(3, Mib(1000), 10), Spread).unwrap();
    let mut distinct = got[0].clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3);

    let mut single = NodeGpus::new(vec![gpu("GPU-0", "A100", 10000, 0)]);
    let two = pod(vec![
        container("a", 1, Mib(6000), 0),
        container("b", 1, Mib(6000), 0),
    ]);
    let err = fit(&single, &two, Spread).unwrap_err().to_string();
    assert!(
        err.starts_with("container \"b\" needs 1 GPU with 6000 MiB"),
        "{err}"
    );
    let small = pod(vec![
        container("a", 1, Mib(4000), 0),
        container("b", 1, Mib(6000), 0),
    ]);
    assert_eq!(
        place(&mut single, &small, Spread).unwrap(),
        [["GPU-0"], ["GPU-0"]]
    );
    assert_eq!(single.usage[0].slices, 2);
}

#[test]
fn unhealthy_gpus_are_skipped() {
    let mut node = a100s(2);
    node.devices[0].healthy = false;
    assert_eq!(
        place(&mut node, &one(1, Mib(10), 0), Binpack).unwrap(),
        [["GPU-1"]]
    );
    let err = fit(&node, &one(2, Mib(10), 0), Spread)
        .unwrap_err()
        .to_string();
    assert!(err.contains("1 of 2 GPUs fit: 1 GPU unhealthy"), "{err}");
}

#[test]
fn type_uuid_and_mode_filters() {
    let mut node = NodeGpus::new(vec![
        gpu("GPU-0", "NVIDIA A100-SXM4-80GB", 81920, 0),
        gpu("GPU-1", "NVIDIA H100 80GB HBM3", 81920, 0),
        gpu("GPU-2", "Tesla T4", 15360, 0),
    ]);
    let with = |options: PodOptions| PodRequest {
        containers: vec![container("main", 1, Mib(1000), 0)],
        options,
    };
    let wants_h100 = with(PodOptions {
        use_gpu_types: vec!["h100".into()],
        ..Default::default()
    });
    assert_eq!(
        uuids(&node, &fit(&node, &wants_h100, Spread).unwrap()),
        [["GPU-1"]]
    );
    // Type lists come lowercased from the parse.
    let no_nvidia = with(PodOptions {
        nouse_gpu_types: vec!["nvidia".into()],
        ..Default::default()
    });
    assert_eq!(
        uuids(&node, &fit(&node, &no_nvidia, Spread).unwrap()),
        [["GPU-2"]]
    );
    let pinned = with(PodOptions {
        use_gpu_uuids: ["GPU-2".into()].into(),
        ..Default::default()
    });
    assert_eq!(
        uuids(&node, &fit(&node, &pinned, Spread).unwrap()),
        [["GPU-2"]]
    );
    let none = with(PodOptions {
        use_gpu_types: vec!["a100".into(), "t4".into()],
        nouse_gpu_uuids: ["GPU-0".into()].into(),
        nouse_gpu_types: vec!["tesla".into()],
        ..Default::default()
    });
    let err = fit(&node, &none, Spread).unwrap_err().to_string();
    assert!(err.contains("0 of 3 GPUs fit"), "{err}");
    assert!(
        err.contains("1 GPU not of a type in nvidia.com/use-gputype"),
        "{err}"
    );
    assert!(
        err.contains("1 GPU excluded by nvidia.com/nouse-gputype"),
        "{err}"
    );
    assert!(
        err.contains("1 GPU excluded by nvidia.com/nouse-gpuuuid"),
        "{err}"
    );

    node.devices[1].mode = OperatingMode::Mps;
    let mps = with(PodOptions {
        vgpu_mode: Some(OperatingMode::Mps),
        ..Default::default()
    });
    assert_eq!(
        uuids(&node, &fit(&node, &mps, Spread).unwrap()),
        [["GPU-1"]]
    );
    let mig = with(PodOptions {
        vgpu_mode: Some(OperatingMode::Mig),
        ..Default::default()
    });
    assert!(
        fit(&node, &mig, Spread)
            .unwrap_err()
            .to_string()
            .contains("3 GPUs not in the mode nvidia.com/vgpu-mode asks for")
    );
}

#[test]
fn numa_bind_keeps_a_container_on_one_numa_node() {
    // GPU-0, GPU-1 on NUMA 0; GPU-2, GPU-3 on NUMA 1. Fill GPU-0 so spread
    // would otherwise pick GPU-1 and GPU-2 (the emptiest pair) across nodes.
    let mut node = a100s(4);
    place(&mut node, &one(1, Mib(81920), 0), Spread).unwrap();
    let options = PodOptions {
        numa_bind: true,
        ..Default::default()
    };
    let request = PodRequest {
        containers: vec![container("main", 2, Mib(1000), 0)],
        options,
    };
    let got = uuids(&node, &fit(&node, &request, Spread).unwrap());
    assert_eq!(
        got,
        [["GPU-2", "GPU-3"]],
        "spread alone would pick GPU-1 and GPU-2 across NUMA nodes"
    );
    let three = PodRequest {
        containers: vec![container("main", 3, Mib(1000), 0)],
        options: request.options.clone(),
    };
    let err = fit(&node, &three, Spread).unwrap_err().to_string();
    assert!(
        err.contains(
            "nvidia.com/numa-bind is set and no NUMA node has 3 fitting GPUs (at most 2 on one)"
        ),
        "{err}"
    );
    assert!(
        fit(
            &node,
            &PodRequest {
                options: PodOptions::default(),
                ..three
            },
            Spread
        )
        .is_ok()
    );
}

#[test]
fn a_node_without_gpus_says_so() {
    let err = fit(&NodeGpus::default(), &one(1, Mib(1), 0), Spread)
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("0 of 0 GPUs fit: the node has no GPUs"),
        "{err}"
    );
}

#[test]
fn node_scores_follow_the_node_policy() {
    let mut full = a100s(2);
    place(&mut full, &one(2, Percent(100), 100), Spread).unwrap();
    let empty = a100s(2);
    assert!(node_score(&full, Binpack) > node_score(&empty, Binpack));
    assert!(node_score(&full, Spread) < node_score(&empty, Spread));
    assert_eq!(node_score(&empty, Spread), score::MAX_SCORE);
    assert_eq!(node_score(&NodeGpus::default(), Binpack), 0);
}

#[test]
fn a_node_with_a_bind_under_way_scores_below_every_idle_node() {
    let mut full = a100s(2);
    place(&mut full, &one(2, Percent(100), 100), Spread).unwrap();
    let mut half = a100s(2);
    place(&mut half, &one(1, Percent(50), 0), Spread).unwrap();
    let mut tenth = a100s(2);
    place(&mut tenth, &one(1, Percent(10), 0), Spread).unwrap();
    let empty = a100s(2);
    for policy in [Binpack, Spread] {
        for node in [&full, &half, &tenth, &empty] {
            assert_eq!(score::prioritized_score(node, policy, true, None), 0);
            let idle = score::prioritized_score(node, policy, false, None);
            assert!((1..=score::MAX_SCORE).contains(&idle), "{idle}");
        }
    }
    // Among idle nodes the policy still decides: half a GPU used on one of
    // two beats a tenth (controllers/tests/scheduling.rs places pods so).
    let idle = |node: &NodeGpus, policy| score::prioritized_score(node, policy, false, None);
    assert!(idle(&full, Binpack) > idle(&half, Binpack));
    assert!(idle(&half, Binpack) > idle(&tenth, Binpack));
    assert!(idle(&tenth, Binpack) >= idle(&empty, Binpack));
    assert!(idle(&empty, Spread) > idle(&half, Spread));
    assert_eq!(
        score::prioritized_score(&NodeGpus::default(), Binpack, false, None),
        0
    );
}

#[derive(Clone, Debug)]
enum Op {
    Place {
        count: u32,
        memory: MemoryRequest,
        cores: u32,
        binpack: bool,
    },
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let memory = prop_oneof![(1u64..50_000).prop_map(Mib), (1u32..=100).prop_map(Percent)];
    prop_oneof![
        3 => (1u32..=3, memory, prop_oneof![Just(0u32), 1u32..=100, Just(100)], any::<bool>())
            .prop_map(|(count, memory, cores, binpack)| Op::Place { count, memory, cores, binpack }),
        1 => any::<usize>().prop_map(Op::Release),
    ]
}

fn devices() -> impl Strategy<Value = Vec<GpuDevice>> {
    prop::collection::vec(
        (
            1_000u64..90_000,
            prop_oneof![Just(100u32), Just(200)],
            1u32..=10,
            0u32..2,
            any::<bool>(),
        ),
        1..6,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(
                |(i, (memory_mib, cores, split_count, numa, healthy))| GpuDevice {
                    family: Default::default(),
                    network_id: None,
                    cores,
                    split_count,
                    healthy: healthy || i == 0,
                    ..gpu(&format!("GPU-{i}"), "A100", memory_mib, numa)
                },
            )
            .collect()
    })
}

proptest! {
    /// Invariant I1: whatever is placed and released, in any order, no device
    /// ever holds more memory, cores or slices than it has, an exclusive slice
    /// is alone, and the usage equals the fold of the live placements.
    #[test]
    fn placements_and_releases_never_break_i1(devices in devices(), ops in prop::collection::vec(op(), 1..60)) {
        let mut node = NodeGpus::new(devices);
        let mut live: Vec<Placement> = Vec::new();
        for op in ops {
            match op {
                Op::Place { count, memory, cores, binpack } => {
                    let policy = if binpack { Binpack } else { Spread };
                    if let Ok(placement) = fit(&node, &one(count, memory, cores), policy) {
                        for slice in placement.slices() {
                            node.charge(slice);
                        }
                        live.push(placement);
                    }
                }
                Op::Release(i) if !live.is_empty() => {
                    let placement = live.swap_remove(i % live.len());
                    for slice in placement.slices() {
                        node.release(slice);
                    }
                }
                Op::Release(_) => {}
            }
            prop_assert!(node.within_capacity(), "I1 broken: {:?}", node.usage);
            // The filter's shortcut must agree with the full fit on every state.
            for policy in [Binpack, Spread] {
                let probe = one(1, Percent(30), 20);
                prop_assert_eq!(feasible(&node, &probe, policy).is_ok(), fit(&node, &probe, policy).is_ok());
                let two = one(2, Mib(1000), 0);
                prop_assert_eq!(feasible(&node, &two, policy).is_ok(), fit(&node, &two, policy).is_ok());
            }
            let mut fold = NodeGpus::new(node.devices.clone());
            for slice in live.iter().flat_map(Placement::slices) {
                fold.charge(slice);
            }
            prop_assert_eq!(&fold.usage, &node.usage);
        }
    }
}

fn mig_gpu(uuid: &str) -> GpuDevice {
    let model = "NVIDIA A100-SXM4-80GB";
    GpuDevice {
        family: Default::default(),
        network_id: None,
        mode: OperatingMode::Mig,
        mig: tessera_api::mig::layout_for_model(model).map(std::sync::Arc::new),
        ..gpu(uuid, model, 81920, 0)
    }
}

/// The profile and placement start each slice of a placement got.
fn cuts(node: &NodeGpus, placement: &Placement) -> Vec<(String, String, u32)> {
    placement
        .slices()
        .map(|s| {
            let device = &node.devices[s.device];
            let cut = s.mig.expect("a MIG slice");
            let profile = &device.mig.as_ref().unwrap().profiles[cut.profile.unwrap()];
            assert_eq!(s.memory_mib, profile.memory_mib);
            (
                device.uuid.clone(),
                profile.name.clone(),
                cut.placement.start,
            )
        })
        .collect()
}

#[test]
fn hamis_dynamic_mig_example_gets_a_1g_instance_on_each_of_two_gpus() {
    // examples/nvidia/dynamic_mig_example.yaml: 2 GPUs, 8000 MiB, vgpu-mode mig.
    let node = NodeGpus::new(vec![mig_gpu("GPU-0"), mig_gpu("GPU-1")]);
    let mut request = one(2, Mib(8000), 0);
    request.options.vgpu_mode = Some(OperatingMode::Mig);
    let placement = fit(&node, &request, Binpack).unwrap();
    assert_eq!(
        cuts(&node, &placement),
        [
            ("GPU-0".to_owned(), "1g.10gb".to_owned(), 6),
            ("GPU-1".to_owned(), "1g.10gb".to_owned(), 6)
        ]
    );
    // 1 of 7 compute slices: 14 % of the SMs.
    assert!(placement.slices().all(|s| s.cores == 14));
}

#[test]
fn mig_instances_fill_a_gpu_without_overlap_then_say_what_is_free() {
    let mut node = NodeGpus::new(vec![mig_gpu("GPU-0")]);
    let mut got = Vec::new();
    for memory in [30_000, 15_000, 8000] {
        let placement = fit(&node, &one(1, Mib(memory), 0), Binpack).unwrap();
        got.extend(cuts(&node, &placement));
        for slice in placement.slices() {
            node.charge(slice);
        }
        assert!(node.within_capacity());
    }
    assert_eq!(
        got.iter()
            .map(|(_, p, start)| format!("{p}@{start}"))
            .collect::<Vec<_>>(),
        ["3g.40gb@4", "1g.20gb@0", "1g.10gb@2"]
    );
    let err = fit(&node, &one(1, Mib(15_000), 0), Binpack)
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with(
            "1 GPU in MIG mode without room (GPU-0 needs a 1g.20gb placement; free there: 1× 1g.10gb)"
        ),
        "{err}"
    );
    let err = fit(&node, &one(1, Mib(90_000), 0), Binpack)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no profile of its NVIDIA A100-SXM4-80GB has 90000 MiB"),
        "{err}"
    );
}

#[test]
fn instances_on_the_hardware_but_in_no_allocation_keep_the_scheduler_away() {
    // An instance nobody holds at slices 4-7 (its pod went, not yet destroyed).
    let node = NodeGpus::new(vec![GpuDevice {
        family: Default::default(),
        network_id: None,
        mig_present: 0xf0,
        profiles: Vec::new(),
        minor: None,
        ..mig_gpu("GPU-0")
    }]);
    let placement = fit(&node, &one(1, Mib(30_000), 0), Binpack).unwrap();
    assert_eq!(cuts(&node, &placement)[0].2, 0, "3g.40gb goes to 0, not 4");
    let node = NodeGpus::new(vec![GpuDevice {
        family: Default::default(),
        network_id: None,
        mig_present: 0x11,
        profiles: Vec::new(),
        minor: None,
        ..mig_gpu("GPU-0")
    }]);
    assert!(fit(&node, &one(1, Mib(30_000), 0), Binpack).is_err());
}

#[test]
fn mps_gpus_serve_one_gpu_per_container() {
    let mut node = a100s(2);
    for device in &mut node.devices {
        device.mode = OperatingMode::Mps;
    }
    assert!(fit(&node, &one(1, Mib(1000), 30), Binpack).is_ok());
    let err = fit(&node, &one(2, Mib(1000), 30), Binpack)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2 GPUs in MPS mode, which serves one GPU per container"),
        "{err}"
    );
}

proptest! {
    /// I1 on dynamic-MIG GPUs: whatever instances are created and released,
    /// in any order, no two share a memory slice, every one sits at an
    /// allowed placement of its profile, and usage is the fold.
    #[test]
    fn mig_instances_never_overlap(
        ops in prop::collection::vec((1u64..90_000, 0u32..=100, 1u32..=2, any::<bool>(), any::<usize>()), 1..60),
    ) {
        let mut node = NodeGpus::new(vec![mig_gpu("GPU-0"), mig_gpu("GPU-1")]);
        let mut live: Vec<Placement> = Vec::new();
        for (memory, cores, count, release, pick) in ops {
            if release && !live.is_empty() {
                let placement = live.swap_remove(pick % live.len());
                for slice in placement.slices() {
                    node.release(slice);
                }
            } else if let Ok(placement) = fit(&node, &one(count, Mib(memory), cores), Binpack) {
                for slice in placement.slices() {
                    let device = &node.devices[slice.device];
                    let cut = slice.mig.unwrap();
                    let profile = &device.mig.as_ref().unwrap().profiles[cut.profile.unwrap()];
                    prop_assert!(profile.memory_mib >= memory);
                    prop_assert!(profile.placements.contains(&cut.placement.start));
                    node.charge(slice);
                }
                live.push(placement);
            }
            prop_assert!(node.within_capacity(), "I1 broken: {:?}", node.usage);
            let mut fold = NodeGpus::new(node.devices.clone());
            for slice in live.iter().flat_map(Placement::slices) {
                fold.charge(slice);
            }
            prop_assert_eq!(&fold.usage, &node.usage);
        }
    }
}
