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

/// What a shared row expects: the devices, or the reason's words for the
/// family.
type RowWant = Result<&'static [&'static str], String>;

/// One family whose devices are counted, as its HAMi table names it.
struct Counted {
    family: DeviceFamily,
    /// Its count resource.
    resource: &'static str,
    /// How rejections name one device.
    noun: &'static str,
    /// The domain of its UUID annotations (`birentech.com`).
    domain: &'static str,
}

/// HAMi's `TestDevices_Fit` rows that Vastai's and Biren's tables share
/// (their `Fit`s are the same but for Vastai's die mode), for `c`.
fn fits_as_hami_does(c: &Counted) {
    let devices = |rows: &[Row]| node(c.family, c.family.as_str(), rows);
    let ask = |n: u32| json!({c.resource: n.to_string()});
    let (noun, uses, nouses) = (
        c.noun,
        format!("{}/use-gpuuuid", c.domain),
        format!("{}/nouse-gpuuuid", c.domain),
    );
    let other = if c.family == DeviceFamily::Biren {
        DeviceFamily::Vastai
    } else {
        DeviceFamily::Biren
    };
    let two = |a: Row, b: Row| devices(&[a, Row { id: "dev-1", ..b }]);
    let cases: Vec<(&str, NodeGpus, _, _, RowWant)> = vec![
        (
            // HAMi picks dev-1 (last index first); spread's tie goes to dev-0.
            "fit success",
            two(FREE, FREE),
            ask(1),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            // HAMi: a request of another type (CardTypeMismatch); a pod asks
            // this family's devices of this family only, so: a node of
            // another family's devices.
            "fit fail: type mismatch",
            node(other, other.as_str(), &[FREE]),
            ask(1),
            json!({}),
            Err(format!("needs 1 {noun}; 0 of 0 {noun}s fit")),
        ),
        (
            "fit fail: user assign use uuid mismatch (CardUuidMismatch)",
            devices(&[Row {
                id: "dev-1",
                ..FREE
            }]),
            ask(1),
            json!({&uses: "dev-0"}),
            Err(format!("1 {noun} not listed in {uses}")),
        ),
        (
            "fit fail: user assign no use uuid match (CardUuidMismatch)",
            devices(&[FREE]),
            ask(1),
            json!({&nouses: "dev-0"}),
            Err(format!("1 {noun} excluded by {nouses}")),
        ),
        (
            "fit fail: card overused (CardTimeSlicingExhausted)",
            devices(&[Row { used: 1, ..FREE }]),
            ask(1),
            json!({}),
            Err(format!("1 {noun} with no free slice")),
        ),
        (
            "fit fail: AllocatedCardsInsufficientRequest",
            devices(&[FREE]),
            ask(2),
            json!({}),
            Err(format!("needs 2 {noun}s; 1 of 1 {noun}s fit")),
        ),
        (
            "mutex policy rejects used device (ExclusiveDeviceAllocateConflict)",
            devices(&[Row {
                used: 1,
                count: 2,
                ..FREE
            }]),
            ask(1),
            json!({"hami.io/gpu-scheduler-policy": "mutex"}),
            Err(format!(
                "1 {noun} in use, but mutex in hami.io/gpu-scheduler-policy takes idle {noun}s only"
            )),
        ),
        (
            // Not in HAMi's table: without mutex the device's count is all
            // that bounds it (memory and cores are not asked).
            "a used device with room in its count takes another container",
            devices(&[Row {
                used: 1,
                count: 2,
                ..FREE
            }]),
            ask(1),
            json!({}),
            Ok(&["dev-0"]),
        ),
        (
            "fit fail: partial allocation AllocatedCardsInsufficientRequest",
            two(Row { count: 100, ..FREE }, Row { count: 100, ..FREE }),
            ask(3),
            json!({}),
            Err(format!("needs 3 {noun}s; 2 of 2 {noun}s fit")),
        ),
        (
            "fit fail: CardNotHealth",
            devices(&[Row {
                healthy: false,
                ..FREE
            }]),
            ask(1),
            json!({}),
            Err(format!("1 {noun} unhealthy")),
        ),
    ];
    for (case, node, limits, annotations, want) in cases {
        let case = format!("{}: {case}", c.family);
        expect(
            &case,
            place(&node, limits, annotations),
            want.as_deref().map_err(String::as_str),
        );
    }
}

#[test]
fn biren_fits_as_hami_does() {
    fits_as_hami_does(&Counted {
        family: DeviceFamily::Biren,
        resource: "birentech.com/gpu",
        noun: "Biren GPU",
        domain: "birentech.com",
    });
}

#[test]
fn vastai_fits_as_hami_does() {
    fits_as_hami_does(&Counted {
        family: DeviceFamily::Vastai,
        resource: VA,
        noun: "Vastai device",
        domain: "vastaitech.com",
    });
    // Die mode under mutex (HAMi's `occupiedAIC` rows).
    let mutex = json!({"hami.io/gpu-scheduler-policy": "mutex"});
    let dies = |rows: &[Row]| node(DeviceFamily::Vastai, "Vastai", rows);
    let busy = Row {
        used: 1,
        count: 2,
        ..die("dev-0", 0)
    };
    expect(
        "mutex die mode rejects idle die on occupied card, picks die on free card",
        place(
            &dies(&[busy, die("dev-1", 0), die("dev-2", 1)]),
            json!({VA: "1"}),
            mutex.clone(),
        ),
        Ok(&["dev-2"]),
    );
    expect(
        "mutex die mode rejects all idle dies on an occupied card",
        place(&dies(&[busy, die("dev-1", 0)]), json!({VA: "1"}), mutex),
        Err("2 Vastai devices in use, but mutex"),
    );
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
