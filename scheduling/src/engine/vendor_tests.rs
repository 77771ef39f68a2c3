//! Other vendors' placement rules as tables, after HAMi's own cases
//! (`pkg/device/hygon/device_test.go` and `pkg/device/ascend/device_test.go`,
//! `TestDevices_Fit`, `TestDevices_Fit_910C`): same devices and usage, the
//! request written as a pod and parsed as the webhook and extender parse it,
//! the same fit or no fit, and a reason naming HAMi's cause in words.
//!
//! Where Tessera chooses differently on purpose, the row says so: HAMi walks
//! devices from the last index down; Tessera orders them by the GPU policy
//! (spread: emptiest first, ties to the lower index). HAMi's `mutex` GPU
//! policy has no Tessera counterpart (100 cores asks for an empty device).

use crate::request::{RequestConfig, parse_pod};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};
use tessera_api::v1alpha1::{DeviceFamily, OperatingMode, SchedulingPolicy};

use super::*;

/// HAMi's `configStr` chips: 910A with its four templates, 910C in a SuperPod.
pub(super) fn config() -> RequestConfig {
    crate::request::vendor_config()
}

/// A device as HAMi's `DeviceUsage` rows give it: id, count (split),
/// used slices, total/used memory, total/used cores, health.
#[derive(Clone, Copy)]
pub(super) struct Row {
    pub(super) id: &'static str,
    pub(super) count: u32,
    pub(super) used: u32,
    pub(super) total_mem: u64,
    pub(super) used_mem: u64,
    pub(super) used_cores: u32,
    pub(super) healthy: bool,
}

pub(super) const FREE: Row = Row {
    id: "dev-0",
    count: 100,
    used: 0,
    total_mem: 1280,
    used_mem: 0,
    used_cores: 0,
    healthy: true,
};

pub(super) fn node(family: DeviceFamily, model: &str, rows: &[Row]) -> NodeGpus {
    let devices = rows
        .iter()
        .enumerate()
        .map(|(i, r)| GpuDevice {
            cordoned: false,
            uuid: r.id.into(),
            index: u32::try_from(i).unwrap(),
            model: model.into(),
            family,
            network_id: None,
            memory_mib: r.total_mem,
            cores: 100,
            split_count: r.count,
            numa_node: Some(0),
            healthy: r.healthy,
            mode: OperatingMode::HamiCore,
            mig: None,
            mig_present: 0,
            profiles: Vec::new(),
            minor: None,
            qos_policy: None,
        })
        .collect();
    let mut node = NodeGpus::new(devices);
    for (usage, r) in node.usage.iter_mut().zip(rows) {
        *usage = DeviceUsage {
            memory_mib: r.used_mem,
            cores: r.used_cores,
            slices: r.used,
            ..DeviceUsage::default()
        };
    }
    node
}

pub(super) fn pod(limits: Value, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "i", "resources": {"limits": limits}}]},
    }))
    .unwrap()
}

/// Fits `limits` (with pod `annotations`) on `node`: the chosen device ids,
/// or the reason.
pub(super) fn place(
    node: &NodeGpus,
    limits: Value,
    annotations: Value,
) -> Result<Vec<String>, String> {
    let request = parse_pod(&pod(limits, annotations), &config())
        .map_err(|e| e.to_string())?
        .expect("asks for devices");
    fit(node, &request, SchedulingPolicy::Spread)
        .map(|p| {
            p.slices()
                .map(|s| node.devices[s.device].uuid.clone())
                .collect()
        })
        .map_err(|r| r.to_string())
}

/// One row: name, node, limits, pod annotations, the devices or the reason.
type Case = (
    &'static str,
    NodeGpus,
    Value,
    Value,
    Result<&'static [&'static str], &'static str>,
);

pub(super) fn expect(case: &str, got: Result<Vec<String>, String>, want: Result<&[&str], &str>) {
    match (got, want) {
        (Ok(ids), Ok(want)) => assert_eq!(ids, want, "{case}"),
        (Err(reason), Err(want)) => {
            assert!(
                reason.contains(want),
                "{case}: {reason:?} should say {want:?}"
            );
        }
        (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn hygon_fits_as_hami_does() {
    let dcu = |rows: &[Row]| node(DeviceFamily::Hygon, "DCU", rows);
    let small = FREE;
    let cases: [Case; 13] = [
        (
            // HAMi picks dev-1 (last index first); spread's tie goes to dev-0.
            "fit success",
            dcu(&[
                Row {
                    total_mem: 128,
                    ..small
                },
                Row {
                    id: "dev-1",
                    total_mem: 128,
                    ..small
                },
            ]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "64", "hygon.com/dcucores": "50"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: memory not enough (CardInsufficientMemory)",
            dcu(&[Row {
                total_mem: 128,
                ..small
            }]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512", "hygon.com/dcucores": "50"}),
            json!({}),
            Err("1 DCU without 512 MiB free (largest free is 128 MiB on dev-0)"),
        ),
        (
            "fit fail: core not enough (CardInsufficientCore)",
            dcu(&[Row {
                total_mem: 1024,
                used_cores: 100,
                ..small
            }]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512", "hygon.com/dcucores": "50"}),
            json!({}),
            Err("1 DCU without 50 cores free"),
        ),
        (
            "fit fail: type mismatch (CardTypeMismatch, hygon.com/use-dcutype)",
            dcu(&[small]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512"}),
            json!({"hygon.com/use-dcutype": "K100"}),
            Err("1 DCU not of a type in hygon.com/use-dcutype"),
        ),
        (
            "fit fail: user assign use uuid mismatch (CardUuidMismatch)",
            dcu(&[Row {
                id: "dev-1",
                ..small
            }]),
            json!({"hygon.com/dcunum": "2", "hygon.com/dcumem": "512", "hygon.com/dcucores": "50"}),
            json!({"hygon.com/use-gpuuuid": "dev-0"}),
            Err("1 DCU not listed in hygon.com/use-gpuuuid"),
        ),
        (
            "fit fail: user assign no use uuid match (CardUuidMismatch)",
            dcu(&[small]),
            json!({"hygon.com/dcunum": "2", "hygon.com/dcumem": "512", "hygon.com/dcucores": "50"}),
            json!({"hygon.com/nouse-gpuuuid": "dev-0"}),
            Err("1 DCU excluded by hygon.com/nouse-gpuuuid"),
        ),
        (
            "fit fail: card overused (CardTimeSlicingExhausted)",
            dcu(&[Row { used: 100, ..small }]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512", "hygon.com/dcucores": "50"}),
            json!({}),
            Err("1 DCU with no free slice"),
        ),
        (
            "fit success: but core limit can't exceed 100",
            dcu(&[small]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512", "hygon.com/dcucores": "120"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: card exclusively (ExclusiveDeviceAllocateConflict)",
            dcu(&[Row { used: 20, ..small }]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512", "hygon.com/dcucores": "100"}),
            json!({}),
            Err("1 DCU in use, but 100 cores needs an empty DCU"),
        ),
        (
            "fit fail: CardComputeUnitsExhausted",
            dcu(&[Row {
                used: 20,
                used_cores: 100,
                ..small
            }]),
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512", "hygon.com/dcucores": "0"}),
            json!({}),
            Err("1 DCU with every core handed out, so a request for 0 cores may not share it"),
        ),
        (
            "fit fail: AllocatedCardsInsufficientRequest",
            dcu(&[Row {
                used: 20,
                used_cores: 10,
                ..small
            }]),
            json!({"hygon.com/dcunum": "2", "hygon.com/dcumem": "512", "hygon.com/dcucores": "50"}),
            json!({}),
            Err("needs 2 DCUs with 512 MiB and 50 cores each; 1 of 1 DCUs fit"),
        ),
        (
            // No dcumem: the whole card (HAMi's MemPercentagereq 100), and
            // 100 cores by default.
            "fit success: memory percentage",
            dcu(&[small]),
            json!({"hygon.com/dcunum": "1"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: partial allocation for multiple cards",
            dcu(&[
                small,
                Row {
                    id: "dev-1",
                    used: 100,
                    ..small
                },
            ]),
            json!({"hygon.com/dcunum": "2", "hygon.com/dcumem": "512", "hygon.com/dcucores": "50"}),
            json!({}),
            Err("1 of 2 DCUs fit: 1 DCU with no free slice"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn ascend_fits_as_hami_does() {
    let npu = |rows: &[Row]| node(DeviceFamily::Ascend, "Ascend910A", rows);
    let card = Row {
        total_mem: 32768,
        ..FREE
    };
    let networks = |ids: [u32; 3]| {
        let mut n = npu(&[
            card,
            Row {
                id: "dev-1",
                ..card
            },
            Row {
                id: "dev-2",
                ..card
            },
        ]);
        for (d, id) in n.devices.iter_mut().zip(ids) {
            d.network_id = Some(id);
        }
        n
    };
    let mut legacy = npu(&[card]);
    legacy.devices[0].mode = OperatingMode::Mig;
    let cases: [Case; 10] = [
        (
            "fit success",
            npu(&[
                card,
                Row {
                    id: "dev-1",
                    ..card
                },
            ]),
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "2000"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: memory not enough, named with the template it rounds up to",
            npu(&[Row {
                used: 1,
                used_mem: 30000,
                ..card
            }]),
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "3000"}),
            json!({}),
            Err(
                "needs 1 Ascend910A NPU with 4369 MiB (vNPU template vir04) and 0 cores; 0 of 1 Ascend910A NPUs fit: 1 Ascend910A NPU without 4369 MiB free (largest free is 2768 MiB on dev-0)",
            ),
        ),
        (
            "fit fail: user assign use uuid mismatch",
            npu(&[Row {
                id: "dev-1",
                ..card
            }]),
            json!({"huawei.com/Ascend910A": "1"}),
            json!({"hami.io/use-Ascend910A-uuid": "dev-0"}),
            Err("1 Ascend910A NPU not listed in hami.io/use-Ascend910A-uuid"),
        ),
        (
            "fit fail: card overused",
            npu(&[Row { used: 100, ..card }]),
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "2000"}),
            json!({}),
            Err("1 Ascend910A NPU with no free slice"),
        ),
        (
            "fit fail: CardNotHealth",
            npu(&[Row {
                healthy: false,
                ..card
            }]),
            json!({"huawei.com/Ascend910A": "1"}),
            json!({}),
            Err("1 Ascend910A NPU unhealthy"),
        ),
        (
            // HAMi answers dev-2, dev-1: the network with most free NPUs.
            "fit success. schedule by NetworkID",
            networks([0, 1, 1]),
            json!({"huawei.com/Ascend910A": "2"}),
            json!({}),
            Ok(&["dev-1", "dev-2"]),
        ),
        (
            "fit fail: hami-core pod on legacy node (ModeNotFit)",
            legacy.clone(),
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "2000"}),
            json!({"huawei.com/vnpu-mode": "hami-core"}),
            Err("on a node without hami-vnpu-core"),
        ),
        (
            "fit ok: annotation-less pod on hami-core node follows node",
            npu(&[card]),
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "2000"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit success: whole-card legacy pod on legacy node",
            legacy,
            json!({"huawei.com/Ascend910A": "1"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "another chip's NPUs are not candidates",
            node(DeviceFamily::Ascend, "Ascend910B4", &[card]),
            json!({"huawei.com/Ascend910A": "1"}),
            json!({}),
            Err("0 of 0 Ascend910A NPUs fit: the node has no Ascend910A NPUs"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn cambricon_fits_as_hami_does() {
    // HAMi's TestDevices_Fit rows for MLUs (the same shape as Hygon's);
    // memory in 256 MiB units as pods write it, cores 100 unless named.
    let mlu = |rows: &[Row]| node(DeviceFamily::Cambricon, "MLU", rows);
    let card = Row {
        total_mem: 16384,
        ..FREE
    };
    let cases: [Case; 6] = [
        (
            "fit success",
            mlu(&[
                card,
                Row {
                    id: "dev-1",
                    ..card
                },
            ]),
            json!({"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "4", "cambricon.com/mlu.smlu.vcore": "50"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: memory not enough",
            mlu(&[Row {
                total_mem: 128,
                ..card
            }]),
            json!({"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "2", "cambricon.com/mlu.smlu.vcore": "50"}),
            json!({}),
            Err("1 MLU without 512 MiB free (largest free is 128 MiB on dev-0)"),
        ),
        (
            "fit fail: user assign no use uuid match",
            mlu(&[card]),
            json!({"cambricon.com/vmlu": "1"}),
            json!({"cambricon.com/nouse-gpuuuid": "dev-0"}),
            Err("1 MLU excluded by cambricon.com/nouse-gpuuuid"),
        ),
        (
            "fit fail: card exclusively (no cores named: 100)",
            mlu(&[Row { used: 20, ..card }]),
            json!({"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "2"}),
            json!({}),
            Err("1 MLU in use, but 100 cores needs an empty MLU"),
        ),
        (
            "fit fail: CardComputeUnitsExhausted",
            mlu(&[Row {
                used: 20,
                used_cores: 100,
                ..card
            }]),
            json!({"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "2", "cambricon.com/mlu.smlu.vcore": "0"}),
            json!({}),
            Err("1 MLU with every core handed out"),
        ),
        (
            "fit fail: CardNotHealth",
            mlu(&[Row {
                healthy: false,
                ..card
            }]),
            json!({"cambricon.com/vmlu": "1"}),
            json!({}),
            Err("1 MLU unhealthy"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn moore_threads_shares_one_card_per_pod() {
    // Cards as HAMi reads them from the Node: 16 cores, 48 GiB, 100 shares.
    let mut gpus = node(
        DeviceFamily::Mthreads,
        "Mthreads",
        &[
            Row {
                total_mem: 49152,
                ..FREE
            },
            Row {
                id: "dev-1",
                total_mem: 49152,
                ..FREE
            },
        ],
    );
    for d in &mut gpus.devices {
        d.cores = 16;
    }
    expect(
        "no memory named: a whole card (16 cores, 96 units)",
        place(&gpus, json!({"mthreads.com/vgpu": "1"}), json!({})),
        Ok(&["dev-0"]),
    );
    expect(
        "an illegal memory size is refused at admission",
        place(
            &gpus,
            json!({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "10"}),
            json!({}),
        ),
        Err(
            "mthreads.com/sgpu-memory: must be one of 2, 4, 8, 16, 32, 64, 96 (units of 512 MiB), got 10",
        ),
    );
    let two = |first: u64, second: u64| -> Result<Vec<String>, String> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": first.to_string(), "mthreads.com/sgpu-core": "4"}}},
                {"name": "b", "resources": {"limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": second.to_string(), "mthreads.com/sgpu-core": "4"}}},
            ]},
        }))
        .unwrap();
        let request = parse_pod(&pod, &config())
            .map_err(|e| e.to_string())?
            .unwrap();
        fit(&gpus, &request, SchedulingPolicy::Spread)
            .map(|p| {
                p.slices()
                    .map(|s| gpus.devices[s.device].uuid.clone())
                    .collect()
            })
            .map_err(|r| r.to_string())
    };
    // Spread would put the second container on the empty dev-1; the pod's
    // containers share the first one's card instead.
    expect("both on dev-0", two(8, 8), Ok(&["dev-0", "dev-0"]));
    expect(
        "the second does not fit beside the first",
        two(64, 64),
        Err(
            "container \"b\" needs 1 Moore Threads GPU with 32768 MiB and 4 cores; 0 of 2 Moore Threads GPUs fit: 1 Moore Threads GPU not the card the pod's other containers use (one card per pod); 1 Moore Threads GPU without 32768 MiB free",
        ),
    );
}

#[test]
fn metax_fits_as_hami_does() {
    // Whole GPUs as HAMi reads them from the Node (65,536 MiB, one
    // container each), and sGPUs as MetaX's plugin registers them (HAMi's
    // TestMetaxDevices_Fit and TestMetaxSDevices_Fit rows).
    let gpu = Row {
        count: 1,
        total_mem: 65536,
        ..FREE
    };
    let gpus = |rows: &[Row]| node(DeviceFamily::Metax, "Metax-GPU", rows);
    let card = Row {
        total_mem: 16384,
        ..FREE
    };
    let sgpus = |rows: &[Row]| node(DeviceFamily::Metax, "Metax-SGPU", rows);
    let cases: [Case; 11] = [
        (
            "gpu: fit success",
            gpus(&[gpu, Row { id: "dev-1", ..gpu }]),
            json!({"metax-tech.com/gpu": "2"}),
            json!({}),
            Ok(&["dev-0", "dev-1"]),
        ),
        (
            "gpu: card overused",
            gpus(&[Row {
                used: 1,
                used_mem: 65536,
                used_cores: 100,
                ..gpu
            }]),
            json!({"metax-tech.com/gpu": "1"}),
            json!({}),
            Err("1 MetaX GPU in use, but 100 cores needs an empty MetaX GPU"),
        ),
        (
            "gpu: type mismatch (sGPUs are not whole GPUs)",
            sgpus(&[card]),
            json!({"metax-tech.com/gpu": "1"}),
            json!({}),
            Err("0 of 0 MetaX GPUs fit: the node has no MetaX GPUs"),
        ),
        (
            "sgpu: fit success",
            sgpus(&[
                card,
                Row {
                    id: "dev-1",
                    ..card
                },
            ]),
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "50", "metax-tech.com/vmemory": "4"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "sgpu: fit fail: memory not enough",
            sgpus(&[Row {
                total_mem: 1024,
                ..card
            }]),
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "50", "metax-tech.com/vmemory": "2"}),
            json!({}),
            Err("1 MetaX sGPU without 2048 MiB free (largest free is 1024 MiB on dev-0)"),
        ),
        (
            "sgpu: fit fail: user assign use uuid mismatch",
            sgpus(&[card]),
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "50"}),
            json!({"metax-tech.com/use-gpuuuid": "dev-1"}),
            Err("1 MetaX sGPU not listed in metax-tech.com/use-gpuuuid"),
        ),
        (
            "sgpu: fit fail: user assign no use uuid match",
            sgpus(&[card]),
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "50"}),
            json!({"metax-tech.com/nouse-gpuuuid": "dev-0"}),
            Err("1 MetaX sGPU excluded by metax-tech.com/nouse-gpuuuid"),
        ),
        (
            "sgpu: fit fail: card exclusively (no vcore named: 100)",
            sgpus(&[Row { used: 20, ..card }]),
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "2"}),
            json!({}),
            Err("1 MetaX sGPU in use, but 100 cores needs an empty MetaX sGPU"),
        ),
        (
            "sgpu: fit fail: CardComputeUnitsExhausted",
            sgpus(&[Row {
                used: 20,
                used_cores: 100,
                ..card
            }]),
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "2", "metax-tech.com/vcore": "0"}),
            json!({}),
            Err("1 MetaX sGPU with every core handed out"),
        ),
        (
            "sgpu: fit fail: AllocatedCardsInsufficientRequest",
            sgpus(&[card]),
            json!({"metax-tech.com/sgpu": "2", "metax-tech.com/vcore": "50"}),
            json!({}),
            Err("needs 2"),
        ),
        (
            "sgpu: fit fail: device unhealthy",
            sgpus(&[Row {
                healthy: false,
                ..card
            }]),
            json!({"metax-tech.com/sgpu": "1"}),
            json!({}),
            Err("1 MetaX sGPU unhealthy"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn enflame_gcus_fit_as_hami_does() {
    // HAMi's TestGCUDevices_Fit: whole GCUs as read from the Node's count
    // (HAMi's placeholder memory of 100, one container each).
    let gcu = Row {
        count: 1,
        total_mem: 100,
        ..FREE
    };
    let gcus = |rows: &[Row]| node(DeviceFamily::Enflame, "GCU", rows);
    let used = Row {
        used: 1,
        used_mem: 100,
        used_cores: 100,
        ..gcu
    };
    let cases: [Case; 5] = [
        (
            "fit success",
            gcus(&[gcu, Row { id: "dev-1", ..gcu }]),
            json!({"enflame.com/gcu": "1"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: type mismatch",
            node(DeviceFamily::Metax, "Metax-GPU", &[gcu]),
            json!({"enflame.com/gcu": "1"}),
            json!({}),
            Err("the node has no GCUs"),
        ),
        (
            "fit fail: device already used",
            gcus(&[used]),
            json!({"enflame.com/gcu": "1"}),
            json!({}),
            Err("1 GCU in use, but 100 cores needs an empty GCU"),
        ),
        (
            "fit fail: partial allocation for multiple cards",
            gcus(&[
                gcu,
                Row {
                    id: "dev-1",
                    ..used
                },
            ]),
            json!({"enflame.com/gcu": "2"}),
            json!({}),
            Err("needs 2"),
        ),
        (
            "fit fail: CardNotHealth",
            gcus(&[Row {
                healthy: false,
                ..gcu
            }]),
            json!({"enflame.com/gcu": "1"}),
            json!({}),
            Err("1 GCU unhealthy"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

/// An AMD node: rows as HAMi's, with each GPU's compute units.
fn amd(rows: &[(Row, u32)]) -> NodeGpus {
    let plain: Vec<Row> = rows.iter().map(|(r, _)| *r).collect();
    let mut node = node(DeviceFamily::Amd, "AMD-MI300X", &plain);
    for (device, (_, units)) in node.devices.iter_mut().zip(rows) {
        device.cores = *units;
    }
    node
}

#[test]
fn amd_fits_as_hami_does() {
    // HAMi's amd TestDevices_Fit: memory in MiB (absent: the whole GPU),
    // cores a percent of each GPU's compute units (absent: 100).
    let card = Row {
        count: 2,
        total_mem: 1000,
        ..FREE
    };
    let cases: [Case; 8] = [
        (
            "allocate two whole cards (dev-1 first: spread prefers its 1 of 12 slots to dev-0's 1 of 2, as HAMi's device score does)",
            amd(&[
                (card, 100),
                (
                    Row {
                        id: "dev-1",
                        count: 12,
                        ..card
                    },
                    100,
                ),
            ]),
            json!({"amd.com/gpu": "2"}),
            json!({}),
            Ok(&["dev-1", "dev-0"]),
        ),
        (
            "insufficient memory",
            amd(&[(
                Row {
                    used_mem: 900,
                    ..card
                },
                100,
            )]),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "500", "amd.com/gpucores": "10"}),
            json!({}),
            Err("1 AMD GPU without 500 MiB free (largest free is 100 MiB on dev-0)"),
        ),
        (
            "insufficient core: 100% of 10 CUs with 9 used",
            amd(&[(
                Row {
                    used_cores: 9,
                    ..card
                },
                10,
            )]),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "100"}),
            json!({}),
            Err("1 AMD GPU without 100% of the compute units free (most free is 1 CUs on dev-0)"),
        ),
        (
            "uuid mismatch (use)",
            amd(&[(
                Row {
                    id: "dev-1",
                    ..card
                },
                100,
            )]),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "10"}),
            json!({"amd.com/use-gpu-uuid": "dev-0"}),
            Err("1 AMD GPU not listed in amd.com/use-gpu-uuid"),
        ),
        (
            "type mismatch (use MI250 on an MI300X)",
            amd(&[(card, 100)]),
            json!({"amd.com/gpu": "1"}),
            json!({"amd.com/use-gputype": "MI250"}),
            Err("1 AMD GPU not of a type in amd.com/use-gputype"),
        ),
        (
            "type excluded (nouse MI300)",
            amd(&[(card, 100)]),
            json!({"amd.com/gpu": "1"}),
            json!({"amd.com/nouse-gputype": " mi300 , "}),
            Err("1 AMD GPU excluded by amd.com/nouse-gputype"),
        ),
        (
            "time slicing exhausted",
            amd(&[(Row { used: 2, ..card }, 100)]),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "10"}),
            json!({}),
            Err("1 AMD GPU with no free slice"),
        ),
        (
            "unhealthy device is rejected",
            amd(&[(
                Row {
                    healthy: false,
                    ..card
                },
                100,
            )]),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "10"}),
            json!({}),
            Err("1 AMD GPU unhealthy"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn amd_cores_become_each_gpus_compute_units() {
    // HAMi: cuCount = floor(percent × CUs / 100), at least 1 and at most
    // all; a slice of every CU is not exclusive (cores are not percent).
    let card = Row {
        count: 4,
        total_mem: 1000,
        ..FREE
    };
    let slices = |node: &NodeGpus, limits: Value| -> Vec<u32> {
        let request = parse_pod(&pod(limits, json!({})), &config())
            .unwrap()
            .unwrap();
        fit(node, &request, SchedulingPolicy::Spread)
            .unwrap()
            .slices()
            .map(|s| s.cores)
            .collect()
    };
    let mi300x = amd(&[(card, 304)]);
    for (percent, units) in [(25, 76), (33, 100), (67, 203), (100, 304)] {
        let limits = json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": percent.to_string()});
        assert_eq!(slices(&mi300x, limits), vec![units], "{percent}%");
    }
    let small = amd(&[(card, 64)]);
    assert_eq!(
        slices(
            &small,
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "1"})
        ),
        vec![1],
        "a positive percent gets at least one CU"
    );
    // 100 of 304 CUs taken by one pod leave 204 for the next, unlike a
    // percent device where 100 would close it.
    let mut shared = amd(&[(card, 304)]);
    let request = parse_pod(
        &pod(
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "33"}),
            json!({}),
        ),
        &config(),
    )
    .unwrap()
    .unwrap();
    for _ in 0..3 {
        let placement = fit(&shared, &request, SchedulingPolicy::Spread).unwrap();
        placement.slices().for_each(|s| shared.charge(s));
    }
    assert_eq!(shared.usage[0].cores, 300);
    assert_eq!(shared.usage[0].exclusive, 0);
    assert!(shared.within_capacity());
    let err = fit(&shared, &request, SchedulingPolicy::Spread).unwrap_err();
    assert!(
        err.to_string().contains("most free is 4 CUs on dev-0"),
        "{err}"
    );
}

/// A Kunlunxin node of eight XPUs of `model`, with `used[i]` MiB held on
/// XPU `i` in `slices[i]` vXPUs (whole XPUs: 98304 in one).
pub(super) fn xpus(model: &str, used: [(u64, u32); 8]) -> NodeGpus {
    let rows: Vec<Row> = used
        .iter()
        .enumerate()
        .map(|(i, &(mib, slices))| Row {
            id: [
                "xpu-0", "xpu-1", "xpu-2", "xpu-3", "xpu-4", "xpu-5", "xpu-6", "xpu-7",
            ][i],
            count: 100,
            used: slices,
            total_mem: 98304,
            used_mem: mib,
            used_cores: u32::try_from(mib * 100 / 98304).unwrap(),
            healthy: true,
        })
        .collect();
    node(DeviceFamily::Kunlunxin, model, &rows)
}

#[test]
fn kunlunxin_xpus_are_placed_by_wing_as_hami_does() {
    // HAMi's kunlun Test_graghSelect rows (whole XPUs: used or not) and the
    // vXPU rows (a card shares only vXPUs of one size).
    const FREE_XPU: (u64, u32) = (0, 0);
    const WHOLE: (u64, u32) = (98304, 1);
    let whole = |used: &[usize]| {
        let mut rows = [FREE_XPU; 8];
        for &i in used {
            rows[i] = WHOLE;
        }
        xpus("kunlun", rows)
    };
    let xpu = |n: u32| json!({"kunlunxin.com/xpu": n.to_string()});
    let quarter =
        |n: u32| json!({"kunlunxin.com/vxpu": n.to_string(), "kunlunxin.com/vxpu-memory": "24576"});
    const Q1: (u64, u32) = (24576, 1);
    const Q2: (u64, u32) = (49152, 2);
    const H1: (u64, u32) = (49152, 1);
    let cases: [Case; 12] = [
        (
            "full allocate",
            whole(&[]),
            xpu(8),
            json!({}),
            Ok(&[
                "xpu-0", "xpu-1", "xpu-2", "xpu-3", "xpu-4", "xpu-5", "xpu-6", "xpu-7",
            ]),
        ),
        (
            "full allocate not success",
            whole(&[5]),
            xpu(8),
            json!({}),
            Err("7 of 8 XPUs fit"),
        ),
        (
            "allocate 2 cards: the wing of three",
            whole(&[5]),
            xpu(2),
            json!({}),
            Ok(&["xpu-4", "xpu-6"]),
        ),
        (
            "allocate 1 card: the wing of three",
            whole(&[5]),
            xpu(1),
            json!({}),
            Ok(&["xpu-4"]),
        ),
        (
            "allocate 1 card: the wing of two",
            whole(&[6, 7]),
            xpu(1),
            json!({}),
            Ok(&["xpu-4"]),
        ),
        (
            "allocate 2 cards according to interconnect",
            whole(&[0, 1, 2, 4, 5, 6]),
            xpu(2),
            json!({}),
            Ok(&["xpu-3", "xpu-7"]),
        ),
        (
            "2 cards without a link",
            whole(&[0, 1, 2, 4, 5, 7]),
            xpu(2),
            json!({}),
            Err("the fitting XPUs (3, 6) hold none"),
        ),
        (
            "allocate 4 cards according to interconnect when have 6 cards, leave 2 cards connected",
            whole(&[3, 7]),
            xpu(4),
            json!({}),
            Ok(&["xpu-0", "xpu-1", "xpu-4", "xpu-5"]),
        ),
        (
            "vXPU: allocate with mixed memory requirements",
            xpus(
                "XPU",
                [FREE_XPU, Q2, FREE_XPU, H1, FREE_XPU, Q1, FREE_XPU, FREE_XPU],
            ),
            quarter(4),
            json!({}),
            Ok(&["xpu-4", "xpu-5", "xpu-6", "xpu-7"]),
        ),
        (
            "vXPU: no suitable devices due to memory mismatch",
            xpus("XPU", [H1; 8]),
            quarter(2),
            json!({}),
            Err("8 vXPUs holding vXPUs of another size"),
        ),
        (
            "vXPU: allocate 2 cards with different memory requirements",
            xpus(
                "XPU",
                [FREE_XPU, Q2, Q1, H1, FREE_XPU, FREE_XPU, Q1, FREE_XPU],
            ),
            quarter(2),
            json!({}),
            Ok(&["xpu-0", "xpu-1"]),
        ),
        (
            "use uuid (HAMi's TestKunlunDevices_Fit_UseUUID)",
            whole(&[]),
            xpu(1),
            json!({"baidu.com/use-gpuuuid": "xpu-5"}),
            Ok(&["xpu-5"]),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
    // A whole XPU is not a vXPU: the types do not mix.
    expect(
        "vXPU request on a whole-XPU node",
        place(&whole(&[]), quarter(1), json!({})),
        Err("the node has no vXPUs"),
    );
    expect(
        "no-use uuid for every XPU (TestKunlunDevices_Fit_NoUseUUID)",
        place(
            &whole(&[]),
            xpu(1),
            json!({"hami.io/no-use-xpu-uuid": "xpu-0,xpu-1,xpu-2,xpu-3,xpu-4,xpu-5,xpu-6,xpu-7"}),
        ),
        Err("8 XPUs excluded by hami.io/no-use-xpu-uuid"),
    );
}

/// An AWS Neuron node of `n` two-core devices of instance type `model`;
/// `held` lists (device, core) pairs live slices hold by index, `whole`
/// devices held by count.
fn neurons(model: &str, n: u32, held: &[(usize, u8)], whole: &[usize]) -> NodeGpus {
    let devices = (0..n)
        .map(|i| GpuDevice {
            cordoned: false,
            uuid: format!("n-AWSNeuron-{i}"),
            index: i,
            model: model.into(),
            family: DeviceFamily::AwsNeuron,
            network_id: None,
            memory_mib: 0,
            cores: 2,
            split_count: 2,
            numa_node: None,
            healthy: true,
            mode: OperatingMode::HamiCore,
            mig: None,
            mig_present: 0,
            profiles: Vec::new(),
            minor: None,
            qos_policy: None,
        })
        .collect();
    let mut node = NodeGpus::new(devices);
    for &(device, core) in held {
        node.charge(&Slice {
            mutex: false,
            device,
            memory_mib: 0,
            cores: 1,
            mig: None,
            core_mask: 1 << core,
            units: 1,
            profile: None,
            sharing: None,
        });
    }
    for &device in whole {
        node.charge(&Slice {
            mutex: false,
            device,
            memory_mib: 0,
            cores: 2,
            mig: None,
            core_mask: 0,
            units: 1,
            profile: None,
            sharing: None,
        });
    }
    node
}

#[test]
fn aws_neuron_devices_are_placed_as_hami_does() {
    // HAMi's awsneuron Fit and graphSelect: one device by cores or whole,
    // several as consecutive free devices (a ring on Inferentia, aligned
    // blocks of 4, 8 or 16 on Trainium).
    let count = |n: u32| json!({"aws.amazon.com/neuron": n.to_string()});
    let cores = |n: u32| json!({"aws.amazon.com/neuroncore": n.to_string()});
    let cases: [Case; 9] = [
        (
            "one whole device (HAMi takes the last: it walks down)",
            neurons("inf2.xlarge", 2, &[], &[]),
            count(1),
            json!({}),
            Ok(&["n-AWSNeuron-0"]),
        ),
        (
            "one core shares a device with another core",
            neurons("inf2.xlarge", 2, &[(0, 0)], &[1]),
            cores(1),
            json!({}),
            Ok(&["n-AWSNeuron-0"]),
        ),
        (
            "two cores need a device with both free",
            neurons("inf2.xlarge", 2, &[(0, 1)], &[]),
            cores(2),
            json!({}),
            Ok(&["n-AWSNeuron-1"]),
        ),
        (
            "Inferentia: two devices anywhere consecutive",
            neurons("inf2.24xlarge", 6, &[], &[0, 3]),
            count(2),
            json!({}),
            Ok(&["n-AWSNeuron-1", "n-AWSNeuron-2"]),
        ),
        (
            "Inferentia: no two consecutive free",
            neurons("inf2.24xlarge", 6, &[(1, 0)], &[3, 5]),
            count(2),
            json!({}),
            Err(
                "AWS Neuron places 2 devices on consecutive free devices (Inferentia's ring), and the free devices (0, 2, 4) hold none",
            ),
        ),
        (
            "Trainium: four devices as an aligned block",
            neurons("trn1.32xlarge", 16, &[], &[1]),
            count(4),
            json!({}),
            Ok(&[
                "n-AWSNeuron-4",
                "n-AWSNeuron-5",
                "n-AWSNeuron-6",
                "n-AWSNeuron-7",
            ]),
        ),
        (
            "Trainium: eight cores are four whole devices",
            neurons("trn1.32xlarge", 8, &[(0, 0)], &[]),
            cores(8),
            json!({}),
            Ok(&[
                "n-AWSNeuron-4",
                "n-AWSNeuron-5",
                "n-AWSNeuron-6",
                "n-AWSNeuron-7",
            ]),
        ),
        (
            "Trainium: two devices are never placed",
            neurons("trn1.32xlarge", 16, &[], &[]),
            count(2),
            json!({}),
            Err("AWS Neuron places 1, 4, 8 or 16 devices on a Trainium node, not 2"),
        ),
        (
            "uuid mismatch",
            neurons("inf2.xlarge", 1, &[], &[]),
            count(1),
            json!({"aws.amazon.com/use-neuron-uuid": "other"}),
            Err("1 Neuron device not listed in aws.amazon.com/use-neuron-uuid"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn aws_neuron_cores_are_handed_out_by_index_and_never_twice() {
    let node = neurons("inf2.xlarge", 1, &[(0, 0)], &[]);
    let request = parse_pod(
        &pod(json!({"aws.amazon.com/neuroncore": "1"}), json!({})),
        &config(),
    )
    .unwrap()
    .unwrap();
    let placement = fit(&node, &request, SchedulingPolicy::Spread).unwrap();
    let slice = placement.slices().next().copied().unwrap();
    assert_eq!(
        (slice.cores, slice.core_mask, slice.memory_mib),
        (1, 0b10, 0)
    );
    let mut full = node.clone();
    full.charge(&slice);
    assert!(full.within_capacity());
    assert_eq!(full.usage[0].core_mask(), 0b11);
    let err = fit(&full, &request, SchedulingPolicy::Spread).unwrap_err();
    assert!(
        err.to_string()
            .contains("1 Neuron device with no free slice"),
        "{err}"
    );
    // A whole device by count holds every core: no core request fits.
    let whole = neurons("inf2.xlarge", 1, &[], &[0]);
    assert!(fit(&whole, &request, SchedulingPolicy::Spread).is_err());
}

#[test]
fn prioritize_ranks_vendor_topology_before_the_policy() {
    // HAMi's Ascend ScoreNode: a pod whose 910 NPUs share one network
    // scores above one spread over two, whatever the node policy says.
    let ascend = |networks: [u32; 4], used: &[usize]| {
        let card = Row {
            total_mem: 32768,
            count: 4,
            ..FREE
        };
        let mut node = node(DeviceFamily::Ascend, "Ascend910A", &[card; 4]);
        for (i, device) in node.devices.iter_mut().enumerate() {
            device.uuid = format!("npu-{i}");
            device.network_id = Some(networks[i]);
        }
        for &i in used {
            node.usage[i] = DeviceUsage {
                memory_mib: 32768,
                cores: 100,
                slices: 1,
                ..DeviceUsage::default()
            };
        }
        node
    };
    let request = parse_pod(
        &pod(json!({"huawei.com/Ascend910A": "2"}), json!({})),
        &config(),
    )
    .unwrap()
    .unwrap();
    let together = ascend([0, 0, 1, 1], &[2]);
    let apart = ascend([0, 1, 2, 3], &[]);
    let policy = SchedulingPolicy::Spread;
    assert_eq!(
        topology_score(&together, &request, policy, policy),
        Some(1.0)
    );
    assert_eq!(topology_score(&apart, &request, policy, policy), Some(0.5));
    let score = |node: &NodeGpus| {
        prioritized_score(
            node,
            policy,
            false,
            topology_score(node, &request, policy, policy),
        )
    };
    assert!(
        score(&together) > score(&apart),
        "{} vs {}: the emptier node loses on topology",
        score(&together),
        score(&apart)
    );
    // NVIDIA and other families keep the policy's 1..=10.
    let nvidia = parse_pod(&pod(json!({"nvidia.com/gpu": "1"}), json!({})), &config())
        .unwrap()
        .unwrap();
    assert_eq!(topology_score(&together, &nvidia, policy, policy), None);
    // Kunlunxin whole XPUs: HAMi's calcscore over the wing bubbles.
    let mut rows = [(0, 0); 8];
    rows[0] = (98304, 1);
    let xpu = xpus("kunlun", rows);
    let one = parse_pod(
        &pod(json!({"kunlunxin.com/xpu": "1"}), json!({})),
        &config(),
    )
    .unwrap()
    .unwrap();
    // XPU 0 in use; the pod gets XPU 1 (the left wing has three free):
    // bubbles 3 before and after, HAMi's 2000.
    assert_eq!(topology_score(&xpu, &one, policy, policy), Some(2.0 / 3.0));
}

/// An Enflame DRS GCU as HAMi's tests list it: 6 slices, 40 GB, the
/// profiles `1g.6gb`, `3g.20gb`, `6g.40gb` (cores 17, 50, 100).
fn drs_gcu(used_slices: u32, used_mib: u64, used_cores: u32, healthy: bool) -> NodeGpus {
    let mut node = node(
        DeviceFamily::Enflame,
        "Enflame",
        &[Row {
            id: "node-a-enflame-drs-0",
            count: 6,
            used: used_slices,
            total_mem: 40960,
            used_mem: used_mib,
            used_cores,
            healthy,
        }],
    );
    node.devices[0].profiles = [
        ("1g.6gb", 1u32, 6u64),
        ("3g.20gb", 3, 20),
        ("6g.40gb", 6, 40),
    ]
    .iter()
    .map(|&(name, size, gb)| Profile {
        name: name.into(),
        id: size.to_string(),
        size,
        memory_mib: gb * 1024,
        cores: (size * 100).div_ceil(6),
    })
    .collect();
    node
}

#[test]
fn enflame_drs_partitions_fit_as_hami_does() {
    // HAMi's enflame TestFit_* cases.
    let slices = |n: u32| json!({"enflame.com/drs-gcu": n.to_string()});
    let cases: [Case; 6] = [
        (
            "select profile by request (3 slices: 3g.20gb)",
            drs_gcu(0, 0, 0, true),
            slices(3),
            json!({}),
            Ok(&["node-a-enflame-drs-0"]),
        ),
        (
            "select profile by memory and cores (20480 MiB is 20 GB; 40% fits 3g's 50%)",
            drs_gcu(0, 0, 0, true),
            json!({"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "40"}),
            json!({}),
            Ok(&["node-a-enflame-drs-0"]),
        ),
        (
            "profile not found",
            drs_gcu(0, 0, 0, true),
            slices(2),
            json!({}),
            Err("1 DRS GCU without a DRS profile for 2 slices"),
        ),
        (
            "unhealthy device rejected",
            drs_gcu(0, 0, 0, false),
            slices(3),
            json!({}),
            Err("1 DRS GCU unhealthy"),
        ),
        (
            "every slice in use",
            drs_gcu(6, 40960, 100, true),
            slices(1),
            json!({}),
            Err("1 DRS GCU with no free slice"),
        ),
        (
            "a 3g partition where 3g.20gb and 1g.6gb are held: cores 50 + 17 + 50 > 100",
            drs_gcu(4, 26624, 67, true),
            slices(3),
            json!({}),
            Err("1 DRS GCU without"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
    // The slice is the profile: its memory, cores and slices.
    let node = drs_gcu(0, 0, 0, true);
    let request = parse_pod(&pod(slices(3), json!({})), &config())
        .unwrap()
        .unwrap();
    let placement = fit(&node, &request, SchedulingPolicy::Spread).unwrap();
    let slice = *placement.slices().next().unwrap();
    assert_eq!(
        (slice.memory_mib, slice.cores, slice.units, slice.profile),
        (20480, 50, 3, Some(1))
    );
    let mut full = node.clone();
    full.charge(&slice);
    full.charge(&slice);
    assert_eq!(
        full.usage[0].slices, 6,
        "two 3g partitions take all six slices"
    );
    assert!(full.within_capacity());
    assert!(fit(&full, &request, SchedulingPolicy::Spread).is_err());
    // The whole-GCU profile (6g.40gb: 100 % of the cores) takes all six
    // slices; it is alone on its GCU, which I1 must accept (Bind checks it).
    let whole = parse_pod(&pod(slices(6), json!({})), &config())
        .unwrap()
        .unwrap();
    let placement = fit(&node, &whole, SchedulingPolicy::Spread).unwrap();
    let slice = *placement.slices().next().unwrap();
    assert_eq!((slice.cores, slice.units), (100, 6));
    let mut taken = node.clone();
    taken.charge(&slice);
    assert!(taken.within_capacity(), "{:?}", taken.usage[0]);
    assert!(fit(&taken, &request, SchedulingPolicy::Spread).is_err());
}

#[test]
fn metax_exclusive_sgpus_prefer_the_smallest_metalink_that_holds_them() {
    // HAMi's TestPrioritizeExclusiveDevices: MetaLink 1 has one GPU,
    // MetaLink 2 two, the last GPU is on none.
    let card = Row {
        total_mem: 16384,
        ..FREE
    };
    let mut sgpus = node(
        DeviceFamily::Metax,
        "Metax-SGPU",
        &[
            card,
            Row {
                id: "dev-1",
                ..card
            },
            Row {
                id: "dev-2",
                ..card
            },
            Row {
                id: "dev-3",
                ..card
            },
        ],
    );
    for (device, link) in sgpus
        .devices
        .iter_mut()
        .zip([Some(1), Some(2), Some(2), None])
    {
        device.network_id = link;
    }
    for (count, want) in [
        ("1", &["dev-0"][..]),
        ("2", &["dev-1", "dev-2"]),
        ("3", &["dev-0", "dev-1", "dev-2"]),
        ("4", &["dev-0", "dev-1", "dev-2", "dev-3"]),
    ] {
        let got = place(&sgpus, json!({"metax-tech.com/sgpu": count}), json!({}));
        expect(&format!("{count} exclusive sGPUs"), got, Ok(want));
    }
    // Shared sGPUs follow the GPU policy, not the MetaLinks.
    let got = place(
        &sgpus,
        json!({"metax-tech.com/sgpu": "2", "metax-tech.com/vcore": "50"}),
        json!({}),
    );
    expect("2 shared sGPUs", got, Ok(&["dev-0", "dev-1"]));
}

#[test]
fn iluvatar_fits_as_hami_does() {
    // HAMi's Test_Fit rows; memory in 256 MiB units as pods write it.
    let gpus = |rows: &[Row]| node(DeviceFamily::Iluvatar, "MR-V100", rows);
    let card = Row {
        total_mem: 32768,
        ..FREE
    };
    let cases: [Case; 5] = [
        (
            // HAMi picks dev-1 (last index first); spread's tie goes to dev-0.
            "fit success",
            gpus(&[
                card,
                Row {
                    id: "dev-1",
                    ..card
                },
            ]),
            json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "1", "iluvatar.ai/MR-V100.vCore": "50"}),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: memory not enough",
            gpus(&[Row {
                total_mem: 128,
                ..card
            }]),
            json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "2", "iluvatar.ai/MR-V100.vCore": "50"}),
            json!({}),
            Err("1 MR-V100 GPU without 512 MiB free (largest free is 128 MiB on dev-0)"),
        ),
        (
            "fit fail: core not enough",
            gpus(&[Row {
                used: 1,
                used_cores: 100,
                ..card
            }]),
            json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "2", "iluvatar.ai/MR-V100.vCore": "50"}),
            json!({}),
            Err("1 MR-V100 GPU without 50 cores free"),
        ),
        (
            "fit fail: type mismatch (another chip's GPUs are no candidates)",
            node(DeviceFamily::Iluvatar, "BI-V150", &[card]),
            json!({"iluvatar.ai/MR-V100-vgpu": "1"}),
            json!({}),
            Err("0 of 0 MR-V100 GPUs fit: the node has no MR-V100 GPUs"),
        ),
        (
            "fit fail: CardNotHealth",
            gpus(&[Row {
                healthy: false,
                ..card
            }]),
            json!({"iluvatar.ai/MR-V100-vgpu": "1"}),
            json!({}),
            Err("1 MR-V100 GPU unhealthy"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn ascend_910c_takes_whole_modules() {
    let card = Row {
        total_mem: 65536,
        ..FREE
    };
    let npus = node(
        DeviceFamily::Ascend,
        "Ascend910C",
        &[
            card,
            Row {
                id: "dev-1",
                ..card
            },
            Row {
                id: "dev-2",
                ..card
            },
        ],
    );
    // HAMi's TestDevices_Fit_910C: dev-0 and dev-1 are module 0, dev-2 has
    // no partner.
    expect(
        "fit success: full modules only",
        place(&npus, json!({"huawei.com/Ascend910C": "2"}), json!({})),
        Ok(&["dev-0", "dev-1"]),
    );
    expect(
        "1 becomes a module pair",
        place(&npus, json!({"huawei.com/Ascend910C": "1"}), json!({})),
        Ok(&["dev-0", "dev-1"]),
    );
    let mut busy = npus.clone();
    busy.usage[0].slices = 100;
    expect(
        "a module with one NPU taken is no module",
        place(&busy, json!({"huawei.com/Ascend910C": "2"}), json!({})),
        Err(
            "Ascend910C NPUs are allocated in module pairs and only 0 modules have both NPUs free (needs 1)",
        ),
    );
    expect(
        "odd counts are refused at admission",
        place(&npus, json!({"huawei.com/Ascend910C": "3"}), json!({})),
        Err("must be 1 or an even number, got 3"),
    );
}

/// `node` with a free Ascend 910A NPU (`npu-0`) beside its devices.
fn with_an_ascend_npu(mut node: NodeGpus) -> NodeGpus {
    node.devices.push(GpuDevice {
        uuid: "npu-0".into(),
        family: DeviceFamily::Ascend,
        model: "Ascend910A".into(),
        memory_mib: 32768,
        ..node.devices[0].clone()
    });
    node.usage.push(DeviceUsage::default());
    node
}

#[test]
fn a_pod_of_two_families_gets_each_from_its_own_devices() {
    let node = with_an_ascend_npu(node(DeviceFamily::Hygon, "DCU", &[FREE]));
    expect(
        "both",
        place(
            &node,
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "512", "huawei.com/Ascend910A": "1"}),
            json!({}),
        ),
        Ok(&["dev-0", "npu-0"]),
    );
    expect(
        "NVIDIA asks find no NVIDIA GPU there",
        place(&node, json!({"nvidia.com/gpu": "1"}), json!({})),
        Err("the node has no GPUs"),
    );
}

#[test]
fn a_mixed_node_serves_each_family_s_pods_but_not_a_pod_of_nvidia_and_another() {
    // A node with an NVIDIA GPU under Tessera's agent and an Ascend NPU
    // under its vendor's plugin.
    let node = with_an_ascend_npu(node(DeviceFamily::Nvidia, "NVIDIA A100", &[FREE]));
    expect(
        "NVIDIA alone",
        place(&node, json!({"nvidia.com/gpu": "1"}), json!({})),
        Ok(&["dev-0"]),
    );
    expect(
        "Ascend alone",
        place(&node, json!({"huawei.com/Ascend910A": "1"}), json!({})),
        Ok(&["npu-0"]),
    );
    // Both fit by room; the rule refuses them, naming the containers.
    let both = place(
        &node,
        json!({"nvidia.com/gpu": "1", "huawei.com/Ascend910A": "1"}),
        json!({}),
    );
    expect(
        "both",
        both,
        Err("asks for NVIDIA GPUs and ascend devices: a pod gets NVIDIA GPUs"),
    );
}

#[test]
fn nvidia_now_keeps_a_no_cores_request_off_a_gpu_whose_cores_are_all_handed_out() {
    let mut node = node(DeviceFamily::Nvidia, "NVIDIA A100", &[FREE]);
    node.usage[0] = DeviceUsage {
        cores: 100,
        slices: 2,
        memory_mib: 100,
        ..DeviceUsage::default()
    };
    expect(
        "no cores left",
        place(&node, json!({"nvidia.com/gpumem": "100"}), json!({})),
        Err("1 GPU with every core handed out"),
    );
}

proptest! {
    /// No sequence of pods of any family, placed where the engine says and
    /// charged, overbooks a device (invariant I1 for every family).
    #[test]
    fn no_family_is_ever_overbooked(
        pods in prop::collection::vec((0u8..7, 1u32..4, 0u64..40_000, 0u32..=100), 1..40),
    ) {
        let mut node = node(DeviceFamily::Hygon, "DCU", &[
            Row { total_mem: 16384, count: 4, ..FREE },
            Row { id: "dev-1", total_mem: 16384, count: 4, ..FREE },
        ]);
        for i in 0..4 {
            node.devices.push(GpuDevice {
                uuid: format!("npu-{i}"),
                index: i,
                family: DeviceFamily::Ascend,
                model: if i < 2 { "Ascend910A" } else { "Ascend910C" }.into(),
                memory_mib: 32768,
                split_count: 3,
                network_id: Some(i % 2),
                ..node.devices[0].clone()
            });
            node.usage.push(DeviceUsage::default());
        }
        for i in 0..2 {
            node.devices.push(GpuDevice {
                uuid: format!("GPU-{i}"),
                family: DeviceFamily::Nvidia,
                model: "NVIDIA L4".into(),
                memory_mib: 24576,
                split_count: 5,
                network_id: None,
                ..node.devices[0].clone()
            });
            node.usage.push(DeviceUsage::default());
        }
        for i in 0..2 {
            node.devices.push(GpuDevice {
                uuid: format!("SGPU-{i}"),
                family: DeviceFamily::Metax,
                model: "Metax-SGPU".into(),
                memory_mib: 16384,
                split_count: 4,
                network_id: Some(1),
                ..node.devices[0].clone()
            });
            node.usage.push(DeviceUsage::default());
        }
        for i in 0..2 {
            node.devices.push(GpuDevice {
                uuid: format!("AMD-{i}"),
                family: DeviceFamily::Amd,
                model: "AMD Instinct MI300X VF".into(),
                memory_mib: 16384,
                cores: 304,
                split_count: 6,
                network_id: None,
                ..node.devices[0].clone()
            });
            node.usage.push(DeviceUsage::default());
        }
        for i in 0..8 {
            node.devices.push(GpuDevice {
                uuid: format!("XPU-{i}"),
                index: i,
                family: DeviceFamily::Kunlunxin,
                model: "XPU".into(),
                memory_mib: 98304,
                cores: 100,
                split_count: 100,
                network_id: None,
                ..node.devices[0].clone()
            });
            node.usage.push(DeviceUsage::default());
        }
        for (family, count, memory, cores) in pods {
            let limits = match family {
                0 => json!({"hygon.com/dcunum": count.to_string(), "hygon.com/dcumem": memory.to_string(), "hygon.com/dcucores": cores.to_string()}),
                1 => json!({"huawei.com/Ascend910A": count.to_string(), "huawei.com/Ascend910A-memory": memory.min(32768).to_string()}),
                2 => json!({"huawei.com/Ascend910C": (count * 2).to_string()}),
                5 => json!({"kunlunxin.com/vxpu": (1u32 << (count - 1)).to_string(), "kunlunxin.com/vxpu-memory": (memory * 3).to_string()}),
                4 => json!({"amd.com/gpu": count.to_string(), "amd.com/gpumem": memory.min(16384).to_string(), "amd.com/gpucores": cores.max(1).to_string()}),
                3 => json!({"metax-tech.com/sgpu": count.to_string(), "metax-tech.com/vmemory": (memory / 1024).min(16).to_string(), "metax-tech.com/vcore": cores.to_string()}),
                _ => json!({"nvidia.com/gpu": count.to_string(), "nvidia.com/gpumem": memory.max(1).to_string(), "nvidia.com/gpucores": cores.to_string()}),
            };
            let Ok(Some(request)) = parse_pod(&pod(limits, json!({})), &config()) else {
                continue;
            };
            if let Ok(placement) = fit(&node, &request, SchedulingPolicy::Binpack) {
                for (slice, container) in placement.containers.iter().flat_map(|c| c.slices.iter().map(move |s| (s, c))) {
                    let device = &node.devices[slice.device];
                    let wanted = request.containers.iter().find(|r| r.name == container.name && r.family == device.family);
                    prop_assert!(wanted.is_some(), "a slice on a device of another family");
                    node.charge(slice);
                }
            }
            prop_assert!(node.within_capacity());
        }
    }
}
