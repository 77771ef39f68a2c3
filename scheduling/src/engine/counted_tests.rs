//! HAMi's placement cases of the families whose devices are counted, not
//! measured (`pkg/device/vastai/device_test.go`,
//! `pkg/device/biren/device_test.go`: `TestDevices_Fit`, Vastai's
//! `TestComputeBestCombination` on a node of dies, and its `ScoreNode`):
//! the same devices and usage, the request written as a pod and parsed as
//! the webhook and the extender parse it. Their requests and hand-offs are
//! tested in their folders (`request/family/{vastai,biren}/tests.rs`).
//!
//! Where Tessera chooses differently on purpose, the row says so: HAMi
//! walks devices from the last index down; Tessera orders them by the GPU
//! policy (spread here: ties to the lower index).

use serde_json::json;
use tessera_api::v1alpha1::{DeviceFamily, OperatingMode, SchedulingPolicy};

use super::vendor_tests::{expect, place};
use super::{DeviceUsage, GpuDevice, NodeGpus, topology_score};
use crate::request::{parse_pod, vendor_config};

const VA: &str = "vastaitech.com/va";

/// What a row expects: the devices chosen, or words of the reason.
type Want = Result<&'static [&'static str], &'static str>;

/// A die of card `card` (the vendor view's network for `custominfo.AIC`).
fn die(id: &'static str, card: u32) -> Row {
    Row {
        id,
        network: Some(card),
        ..FREE
    }
}

/// A device as HAMi's `DeviceUsage` rows give it.
#[derive(Clone, Copy)]
struct Row {
    /// Its id.
    id: &'static str,
    /// Containers it takes (HAMi's `Count`).
    count: u32,
    /// Containers it holds (HAMi's `Used`).
    used: u32,
    /// HAMi's `Health`.
    healthy: bool,
    /// The network the vendor view gives it (a Vastai die's card).
    network: Option<u32>,
}

/// An idle, healthy device of count 1 on no network.
const FREE: Row = Row {
    id: "dev-0",
    count: 1,
    used: 0,
    healthy: true,
    network: None,
};

/// A node of `family`'s devices of `model`, with 32 GiB each (what the
/// plugins register) and 100 cores (as HAMi's `GetNodeDevices` sets them).
fn node(family: DeviceFamily, model: &str, rows: &[Row]) -> NodeGpus {
    let devices = rows
        .iter()
        .zip(0..)
        .map(|(r, index)| GpuDevice {
            uuid: r.id.into(),
            index,
            model: model.into(),
            family,
            network_id: r.network,
            memory_mib: 32768,
            cores: 100,
            split_count: r.count,
            numa_node: Some(0),
            healthy: r.healthy,
            cordoned: false,
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
        // A held slice as Bind records one of these: 1 MiB, no cores.
        *usage = DeviceUsage {
            memory_mib: u64::from(r.used),
            slices: r.used,
            ..DeviceUsage::default()
        };
    }
    node
}

#[test]
fn biren_fits_as_hami_does() {
    const GPU: &str = "birentech.com/gpu";
    let gpus = |rows: &[Row]| node(DeviceFamily::Biren, "Biren", rows);
    let one = json!({GPU: "1"});
    let mutex = json!({"hami.io/gpu-scheduler-policy": "mutex"});
    let cases: [(&str, _, _, _, Result<&[&str], &str>); 10] = [
        (
            // HAMi picks dev-1 (last index first); spread's tie goes to dev-0.
            "fit success",
            gpus(&[
                FREE,
                Row {
                    id: "dev-1",
                    ..FREE
                },
            ]),
            one.clone(),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            // HAMi: a request of another type (CardTypeMismatch); a pod can
            // only ask Biren GPUs of Biren GPUs, so: a node of other devices.
            "fit fail: type mismatch",
            node(DeviceFamily::Hygon, "DCU", &[FREE]),
            one.clone(),
            json!({}),
            Err("needs 1 Biren GPU; 0 of 0 Biren GPUs fit"),
        ),
        (
            "fit fail: user assign use uuid mismatch (CardUuidMismatch)",
            gpus(&[Row {
                id: "dev-1",
                ..FREE
            }]),
            one.clone(),
            json!({"birentech.com/use-gpuuuid": "dev-0"}),
            Err("1 Biren GPU not listed in birentech.com/use-gpuuuid"),
        ),
        (
            "fit fail: user assign no use uuid match (CardUuidMismatch)",
            gpus(&[FREE]),
            one.clone(),
            json!({"birentech.com/nouse-gpuuuid": "dev-0"}),
            Err("1 Biren GPU excluded by birentech.com/nouse-gpuuuid"),
        ),
        (
            "fit fail: card overused (CardTimeSlicingExhausted)",
            gpus(&[Row { used: 1, ..FREE }]),
            one.clone(),
            json!({}),
            Err("1 Biren GPU with no free slice"),
        ),
        (
            "fit fail: AllocatedCardsInsufficientRequest",
            gpus(&[FREE]),
            json!({GPU: "2"}),
            json!({}),
            Err("needs 2 Biren GPUs; 1 of 1 Biren GPUs fit"),
        ),
        (
            "mutex policy rejects used device (ExclusiveDeviceAllocateConflict)",
            gpus(&[Row {
                used: 1,
                count: 2,
                ..FREE
            }]),
            one.clone(),
            mutex.clone(),
            Err(
                "1 Biren GPU in use, but mutex in hami.io/gpu-scheduler-policy takes idle Biren GPUs only",
            ),
        ),
        (
            // Not in HAMi's table: without mutex the GPU's count is all
            // that bounds it (memory and cores are not asked).
            "a used GPU with room in its count takes another container",
            gpus(&[Row {
                used: 1,
                count: 2,
                ..FREE
            }]),
            one.clone(),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: partial allocation for multiple cards",
            gpus(&[
                Row { count: 100, ..FREE },
                Row {
                    id: "dev-1",
                    count: 100,
                    ..FREE
                },
            ]),
            json!({GPU: "3"}),
            json!({}),
            Err("needs 3 Biren GPUs; 2 of 2 Biren GPUs fit"),
        ),
        (
            "fit fail: CardNotHealth",
            gpus(&[Row {
                healthy: false,
                ..FREE
            }]),
            one,
            json!({}),
            Err("1 Biren GPU unhealthy"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn vastai_fits_as_hami_does() {
    let cards = |rows: &[Row]| node(DeviceFamily::Vastai, "Vastai", rows);
    let one = json!({VA: "1"});
    let mutex = json!({"hami.io/gpu-scheduler-policy": "mutex"});
    let cases: [(&str, _, _, _, Result<&[&str], &str>); 11] = [
        (
            // HAMi picks dev-1 (last index first); spread's tie goes to dev-0.
            "fit success",
            cards(&[
                FREE,
                Row {
                    id: "dev-1",
                    ..FREE
                },
            ]),
            one.clone(),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            // HAMi: a request of another type; a pod asks Vastai devices of
            // Vastai devices only, so: a node of other devices.
            "fit fail: type mismatch",
            node(DeviceFamily::Biren, "Biren", &[FREE]),
            one.clone(),
            json!({}),
            Err("needs 1 Vastai device; 0 of 0 Vastai devices fit"),
        ),
        (
            "fit fail: user assign use uuid mismatch",
            cards(&[Row {
                id: "dev-1",
                ..FREE
            }]),
            one.clone(),
            json!({"vastaitech.com/use-gpuuuid": "dev-0"}),
            Err("1 Vastai device not listed in vastaitech.com/use-gpuuuid"),
        ),
        (
            "fit fail: user assign no use uuid match",
            cards(&[FREE]),
            one.clone(),
            json!({"vastaitech.com/nouse-gpuuuid": "dev-0"}),
            Err("1 Vastai device excluded by vastaitech.com/nouse-gpuuuid"),
        ),
        (
            "fit fail: card overused",
            cards(&[Row { used: 1, ..FREE }]),
            one.clone(),
            json!({}),
            Err("1 Vastai device with no free slice"),
        ),
        (
            "fit fail: AllocatedCardsInsufficientRequest",
            cards(&[FREE]),
            json!({VA: "2"}),
            json!({}),
            Err("needs 2 Vastai devices; 1 of 1 Vastai devices fit"),
        ),
        (
            "mutex policy rejects used device",
            cards(&[Row {
                used: 1,
                count: 2,
                ..FREE
            }]),
            one.clone(),
            mutex.clone(),
            Err("1 Vastai device in use, but mutex"),
        ),
        (
            "mutex die mode rejects idle die on occupied card, picks die on free card",
            cards(&[
                Row {
                    used: 1,
                    count: 2,
                    ..die("dev-0", 0)
                },
                die("dev-1", 0),
                die("dev-2", 1),
            ]),
            one.clone(),
            mutex.clone(),
            Ok(&["dev-2"]),
        ),
        (
            "mutex die mode rejects all idle dies on an occupied card",
            cards(&[
                Row {
                    used: 1,
                    count: 2,
                    ..die("dev-0", 0)
                },
                die("dev-1", 0),
            ]),
            one.clone(),
            mutex,
            Err("2 Vastai devices in use, but mutex"),
        ),
        (
            "fit fail: partial allocation AllocatedCardsInsufficientRequest",
            cards(&[
                Row { count: 100, ..FREE },
                Row {
                    id: "dev-1",
                    count: 100,
                    ..FREE
                },
            ]),
            json!({VA: "3"}),
            json!({}),
            Err("needs 3 Vastai devices; 2 of 2 Vastai devices fit"),
        ),
        (
            "fit fail: CardNotHealth",
            cards(&[Row {
                healthy: false,
                ..FREE
            }]),
            one,
            json!({}),
            Err("1 Vastai device unhealthy"),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        expect(case, place(&node, limits, annotations), want);
    }
}

#[test]
fn dies_come_from_the_cards_with_the_most_fitting_dies_first() {
    // TestComputeBestCombination's devices: card 1 has three dies, card 2
    // two, card 3 one.
    let dies = node(
        DeviceFamily::Vastai,
        "Vastai",
        &[
            die("dev1", 0),
            die("dev2", 0),
            die("dev3", 0),
            die("dev4", 1),
            die("dev5", 1),
            die("dev6", 2),
        ],
    );
    let cases: [(&str, u32, Want); 4] = [
        (
            "single AIC group, sufficient to meet demand",
            2,
            Ok(&["dev1", "dev2"]),
        ),
        (
            "multiple AIC groups, select by count after sorting",
            3,
            Ok(&["dev1", "dev2", "dev3"]),
        ),
        (
            "multiple AIC groups, need to take across groups",
            4,
            Ok(&["dev1", "dev2", "dev3", "dev4"]),
        ),
        // HAMi's Fit fails before it combines.
        (
            "request number exceeds available devices",
            7,
            Err("needs 7 Vastai devices; 6 of 6"),
        ),
    ];
    for (case, count, want) in cases {
        expect(
            case,
            place(&dies, json!({VA: count.to_string()}), json!({})),
            want,
        );
    }
    // Card 1 busy in one die: two dies now come from card 2, not 1 and 3.
    let mut busy = dies.clone();
    busy.usage[0].slices = 1;
    expect(
        "a card's used die leaves it fewer fitting dies",
        place(&busy, json!({VA: "2"}), json!({})),
        Ok(&["dev2", "dev3"]),
    );
}

#[test]
fn nodes_score_by_how_few_cards_a_pods_dies_span() {
    let request = parse_pod(
        &super::vendor_tests::pod(json!({VA: "2"}), json!({})),
        &vendor_config(),
    )
    .unwrap()
    .unwrap();
    let score = |rows: &[Row]| {
        let node = node(DeviceFamily::Vastai, "Vastai", rows);
        topology_score(
            &node,
            &request,
            SchedulingPolicy::Spread,
            SchedulingPolicy::Binpack,
        )
    };
    // HAMi's ScoreNode: the largest share of a container's dies on one card.
    assert_eq!(score(&[die("a", 0), die("b", 0), die("c", 1)]), Some(1.0));
    assert_eq!(score(&[die("a", 0), die("b", 1)]), Some(0.5));
    // Whole cards (no die mode): HAMi scores 0 everywhere; Tessera none.
    assert_eq!(
        score(&[
            FREE,
            Row {
                id: "dev-1",
                ..FREE
            }
        ]),
        None
    );
}
