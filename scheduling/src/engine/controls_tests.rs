//! HAMi's scheduling controls, case by case from HAMi's own tests: the
//! `mutex` GPU policy (`TestFit_MutexPolicy`, each vendor's "mutex policy
//! rejects used device"), per-pod scoring weights
//! (`TestComputeScoreWithResourceWeights`, `TestCalcScoreUsesPodDeviceScoringWeights`)
//! and the per-GPU cordon (`TestFit_DeviceCordon`).

use crate::request::{ScoringWeights, parse_pod};
use pretty_assertions::assert_eq;
use serde_json::json;
use tessera_api::v1alpha1::{DeviceFamily, SchedulingPolicy};

use super::vendor_tests::{FREE, Row, config, expect, node, pod, xpus};
use super::*;

/// Fits `limits` under `policy` with `annotations`: the device ids or the reason.
fn place_under(
    node: &NodeGpus,
    policy: SchedulingPolicy,
    limits: serde_json::Value,
    annotations: serde_json::Value,
) -> Result<Vec<String>, String> {
    let request = parse_pod(&pod(limits, annotations), &config())
        .map_err(|e| e.to_string())?
        .expect("asks for devices");
    fit(node, &request, policy)
        .map(|p| {
            p.slices()
                .map(|s| node.devices[s.device].uuid.clone())
                .collect()
        })
        .map_err(|r| r.to_string())
}

const MUTEX: &str = "hami.io/gpu-scheduler-policy";

fn nvidia(rows: &[Row]) -> NodeGpus {
    node(DeviceFamily::Nvidia, "NVIDIA A100", rows)
}

#[test]
fn mutex_takes_only_idle_gpus() {
    // TestFit_MutexPolicy: "used" holds a slice, "idle" none.
    let row = Row {
        count: 10,
        total_mem: 8192,
        ..FREE
    };
    let gpus = nvidia(&[
        Row {
            id: "used",
            used: 1,
            ..row
        },
        Row { id: "idle", ..row },
    ]);
    let one =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100", "nvidia.com/gpucores": "10"});
    let two =
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100", "nvidia.com/gpucores": "10"});
    use SchedulingPolicy::Binpack;
    // Binpack alone prefers the busy GPU; mutex (alone or chained) the idle one.
    expect(
        "binpack",
        place_under(&gpus, Binpack, one.clone(), json!({})),
        Ok(&["used"]),
    );
    for policy in ["mutex", "mutex,binpack", "binpack, mutex"] {
        expect(
            policy,
            place_under(&gpus, Binpack, one.clone(), json!({MUTEX: policy})),
            Ok(&["idle"]),
        );
    }
    expect(
        "two GPUs, one idle",
        place_under(&gpus, Binpack, two, json!({MUTEX: "mutex"})),
        Err(
            "1 of 2 GPUs fit: 1 GPU in use, but mutex in hami.io/gpu-scheduler-policy takes idle GPUs only",
        ),
    );
}

#[test]
fn mutex_rejects_a_used_device_of_every_family() {
    // The vendors' "mutex policy rejects used device" rows: one device with
    // one of two slices used, which fits without mutex.
    let dev = Row {
        count: 2,
        used: 1,
        total_mem: 128,
        ..FREE
    };
    let cases = [
        (
            node(DeviceFamily::Hygon, "DCU", &[dev]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "64", "hygon.com/dcucores": "50"}),
            "1 DCU in use",
        ),
        (
            node(
                DeviceFamily::Iluvatar,
                "MR-V100",
                &[Row {
                    total_mem: 4096,
                    ..dev
                }],
            ),
            json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "1", "iluvatar.ai/MR-V100.vCore": "50"}),
            "1 MR-V100 GPU in use",
        ),
        (
            nvidia(&[dev]),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "64", "nvidia.com/gpucores": "50"}),
            "1 GPU in use",
        ),
    ];
    for (node, limits, reason) in cases {
        assert!(
            place_under(&node, SchedulingPolicy::Spread, limits.clone(), json!({})).is_ok(),
            "{reason}: fits without mutex"
        );
        let got = place_under(
            &node,
            SchedulingPolicy::Spread,
            limits,
            json!({MUTEX: "mutex"}),
        );
        let err = got.expect_err(reason);
        assert!(err.contains(reason) && err.contains("takes idle"), "{err}");
    }
    // TestKunlunVDevices_Fit_Mutex: eight XPUs each with one quarter vXPU;
    // the default shares, mutex finds 8 of 8 busy.
    const Q1: (u64, u32) = (24576, 1);
    let xpus = xpus("XPU", [Q1; 8]);
    let quarter = json!({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "24576"});
    assert!(place_under(&xpus, SchedulingPolicy::Spread, quarter.clone(), json!({})).is_ok());
    let err = place_under(
        &xpus,
        SchedulingPolicy::Spread,
        quarter,
        json!({MUTEX: "mutex"}),
    )
    .unwrap_err();
    assert!(err.contains("0 of 8 vXPUs fit: 8 vXPUs in use"), "{err}");
}

#[test]
fn a_mutex_slice_keeps_its_gpu_to_itself() {
    // Beyond HAMi (its issue #3038): a GPU a mutex pod took takes no other
    // pod while the slice lives, mutex or not, and a mutex pod's second
    // container does not join its first's GPU.
    let mut gpus = nvidia(&[
        Row {
            count: 10,
            total_mem: 8192,
            ..FREE
        },
        Row {
            id: "dev-1",
            count: 10,
            total_mem: 8192,
            ..FREE
        },
    ]);
    let small =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100", "nvidia.com/gpucores": "10"});
    let request = parse_pod(&pod(small.clone(), json!({MUTEX: "mutex"})), &config())
        .unwrap()
        .unwrap();
    let placement = fit(&gpus, &request, SchedulingPolicy::Spread).unwrap();
    for slice in placement.slices() {
        assert!(slice.mutex);
        gpus.charge(slice);
    }
    assert_eq!(gpus.usage[0].exclusive, 1);
    expect(
        "a plain pod after the mutex pod",
        place_under(&gpus, SchedulingPolicy::Binpack, small.clone(), json!({})),
        Ok(&["dev-1"]),
    );
    for slice in placement.slices() {
        gpus.release(slice);
    }
    assert_eq!(gpus.usage[0], DeviceUsage::default(), "release undoes it");

    let two_containers: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": {MUTEX: "mutex"}},
        "spec": {"containers": [
            {"name": "a", "image": "i", "resources": {"limits": small}},
            {"name": "b", "image": "i", "resources": {"limits": small}},
        ]},
    }))
    .unwrap();
    let request = parse_pod(&two_containers, &config()).unwrap().unwrap();
    let placement = fit(&gpus, &request, SchedulingPolicy::Binpack).unwrap();
    let devices: Vec<usize> = placement.slices().map(|s| s.device).collect();
    assert_eq!(devices, [0, 1], "each container on its own idle GPU");
}

/// gpu-a and gpu-b of HAMi's weight tests: 10 slots, 100 cores, 100 MiB.
fn weighted_pair() -> NodeGpus {
    let row = Row {
        count: 10,
        total_mem: 100,
        ..FREE
    };
    nvidia(&[
        Row {
            id: "gpu-a",
            used: 1,
            used_cores: 90,
            used_mem: 10,
            ..row
        },
        Row {
            id: "gpu-b",
            used: 7,
            used_cores: 10,
            used_mem: 20,
            ..row
        },
    ])
}

#[test]
fn scoring_weights_compute_hamis_device_scores() {
    // TestComputeScoreWithResourceWeights: 40 % of memory, no cores.
    let node = weighted_pair();
    let slice = Slice::plain(0, 40, 0);
    let scores = |slot, core, memory| {
        let weights = ScoringWeights { slot, core, memory };
        [0, 1].map(|i| {
            let score = device_score(&node.devices[i], &node.usage[i], &slice, weights);
            (10.0 * score).round() as i64
        })
    };
    assert_eq!(scores(1, 1, 1), [16, 15]);
    assert_eq!(scores(1, 1, 3), [26, 27]);
    assert_eq!(scores(1, 3, 1), [34, 17]);
}

#[test]
fn scoring_weights_reorder_the_gpus_of_a_node() {
    // TestCalcScoreUsesPodDeviceScoringWeights and the sort cases of
    // TestComputeScoreWithResourceWeights.
    let node = weighted_pair();
    let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "40", "nvidia.com/gpucores": "0"});
    let weights = "hami.io/device-scoring-weights";
    use SchedulingPolicy::{Binpack, Spread};
    let cases = [
        (Binpack, json!({}), "gpu-a"),
        (Binpack, json!({weights: "slot=1,core=1,memory=3"}), "gpu-b"),
        (Spread, json!({weights: "slot=1,core=1,memory=3"}), "gpu-a"),
        (Binpack, json!({weights: "slot=1,core=3,memory=1"}), "gpu-a"),
        (
            Spread,
            json!({weights: "core=3, memory=1, slot=1"}),
            "gpu-b",
        ),
    ];
    for (policy, annotations, want) in cases {
        let case = format!("{policy:?} {annotations}");
        expect(
            &case,
            place_under(&node, policy, limits.clone(), annotations),
            Ok(&[want]),
        );
    }
}

#[test]
fn cordoned_gpus_take_no_new_slice_and_keep_theirs() {
    // TestFit_DeviceCordon: two GPUs, 64 MiB and 50 cores asked.
    let row = Row {
        total_mem: 128,
        ..FREE
    };
    let limits =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "64", "nvidia.com/gpucores": "50"});
    // dev-1 runs a pod; binpack would pick it.
    let mut gpus = nvidia(&[
        row,
        Row {
            id: "dev-1",
            used: 1,
            used_cores: 50,
            used_mem: 64,
            ..row
        },
    ]);
    let binpack = SchedulingPolicy::Binpack;
    expect(
        "no cordon",
        place_under(&gpus, binpack, limits.clone(), json!({})),
        Ok(&["dev-1"]),
    );
    gpus.devices[1].cordoned = true;
    let held = gpus.usage[1];
    expect(
        "dev-1 cordoned",
        place_under(&gpus, binpack, limits.clone(), json!({})),
        Ok(&["dev-0"]),
    );
    assert_eq!(gpus.usage[1], held, "the running pod's slice stays");
    gpus.devices[0].cordoned = true;
    expect(
        "both cordoned",
        place_under(&gpus, binpack, limits.clone(), json!({})),
        Err("0 of 2 GPUs fit: 2 GPUs cordoned (hami.io/device-cordon on the Node"),
    );
    // Cordon beats every later check, as HAMi's order has it.
    gpus.devices[0].healthy = false;
    let err = place_under(&gpus, binpack, limits, json!({})).unwrap_err();
    assert!(err.contains("1 GPU unhealthy; 1 GPU cordoned"), "{err}");
}
