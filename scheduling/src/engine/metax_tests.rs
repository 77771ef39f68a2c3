//! MetaX sGPUs' co-location rules and scores, after HAMi's
//! `pkg/device/metax/sdevice_test.go` (`TestCheckAppClass`,
//! `TestCheckDeviceQos`, `TestMetaxSDevices_Fit`,
//! `TestPrioritizeOnlineDevices`, `TestScoreOnlineDevices`,
//! `TestScoreExclusiveDevices`) and `device_test.go` (`ScoreNode`'s
//! topology maps): the same devices and holders, the pod written as a pod
//! and parsed as the webhook and extender parse it.

use std::collections::BTreeSet;

use crate::request::parse_pod;
use proptest::prelude::*;
use serde_json::{Value, json};
use tessera_api::v1alpha1::{
    AppClass, DeviceFamily, PlacementScore, QosPolicy, SchedulingPolicy, Sharing,
};

use super::topology::{exclusive_score, online_score};
use super::vendor_tests::{FREE, Row, config, expect, node, place, pod};
use super::*;

/// `n` MetaX sGPU devices (`dev-0`...) of 16 GiB, 4 sGPUs each, on no
/// MetaLink.
fn sgpus(n: usize) -> NodeGpus {
    const IDS: [&str; 8] = [
        "dev-0", "dev-1", "dev-2", "dev-3", "dev-4", "dev-5", "dev-6", "dev-7",
    ];
    let rows: Vec<Row> = IDS[..n]
        .iter()
        .map(|id| Row {
            id,
            count: 4,
            total_mem: 16384,
            ..FREE
        })
        .collect();
    node(DeviceFamily::Metax, "Metax-SGPU", &rows)
}

/// Charges a 1 GiB sGPU of `cores` on `device` for a pod of `class` and
/// `qos`, as the ledger charges a live allocation.
fn hold(
    node: &mut NodeGpus,
    device: usize,
    class: Option<AppClass>,
    qos: Option<QosPolicy>,
    cores: u32,
) {
    node.charge(&Slice {
        mutex: false,
        device,
        memory_mib: 1024,
        cores,
        mig: None,
        core_mask: 0,
        units: 1,
        profile: None,
        sharing: Some(Sharing {
            app_class: class,
            qos_policy: qos,
        }),
    });
}

/// Pod annotations for an app class and a QoS policy.
fn annotations(class: Option<&str>, qos: Option<&str>) -> Value {
    let mut a = serde_json::Map::new();
    if let Some(class) = class {
        a.insert("metax-tech.com/sgpu-app-class".into(), class.into());
    }
    if let Some(qos) = qos {
        a.insert("metax-tech.com/sgpu-qos-policy".into(), qos.into());
    }
    Value::Object(a)
}

fn one_sgpu(cores: &str) -> Value {
    json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": cores, "metax-tech.com/vmemory": "1"})
}

const ONLINE: Option<AppClass> = Some(AppClass::Online);
const OFFLINE: Option<AppClass> = Some(AppClass::Offline);
const BEST_EFFORT: Option<QosPolicy> = Some(QosPolicy::BestEffort);
const BURST: Option<QosPolicy> = Some(QosPolicy::BurstShare);

#[test]
fn app_classes_share_a_gpu_only_with_each_other_as_hami_does() {
    // TestCheckAppClass: (name, holders of dev-0, the pod's class, fits).
    type Holders = &'static [Option<AppClass>];
    let cases: [(&str, Holders, Option<&str>, bool); 9] = [
        ("idle device fit (normal)", &[], None, true),
        ("idle device fit (online)", &[], Some("online"), true),
        ("idle device fit (offline)", &[], Some("offline"), true),
        ("normal task unfit online device", &[ONLINE], None, false),
        ("normal task unfit offline device", &[OFFLINE], None, false),
        ("normal task fit normal device", &[None], None, true),
        (
            "online task unfit normal device",
            &[None],
            Some("online"),
            false,
        ),
        (
            "online task fit online/offline device",
            &[ONLINE, OFFLINE],
            Some("online"),
            true,
        ),
        (
            "offline task unfit online device",
            &[ONLINE, OFFLINE],
            Some("offline"),
            false,
        ),
    ];
    for (name, holders, class, fits) in cases {
        let mut gpu = sgpus(1);
        for &holder in holders {
            let qos = holder.is_none().then_some(QosPolicy::BestEffort);
            hold(&mut gpu, 0, holder, qos, 10);
        }
        let qos = (class != Some("online")).then_some("best-effort");
        let got = place(&gpu, one_sgpu("50"), annotations(class, qos));
        let want: Result<&[&str], &str> = if fits {
            Ok(&["dev-0"])
        } else {
            Err("1 MetaX sGPU running ")
        };
        expect(name, got, want);
    }
    // An offline pod joins a GPU of offline pods only.
    let mut offline = sgpus(1);
    hold(&mut offline, 0, OFFLINE, BEST_EFFORT, 10);
    let got = place(
        &offline,
        one_sgpu("50"),
        annotations(Some("offline"), Some("best-effort")),
    );
    expect("offline task fit offline device", got, Ok(&["dev-0"]));
    // TestMetaxSDevices_Fit "online task, app class unfit": the reason
    // names the rule and the annotation.
    let mut normal = sgpus(1);
    hold(&mut normal, 0, None, BEST_EFFORT, 10);
    let reason = place(&normal, one_sgpu("50"), annotations(Some("online"), None)).unwrap_err();
    assert!(
        reason.contains(
            "which share a GPU only with each other (metax-tech.com/sgpu-app-class: online)"
        ),
        "{reason}"
    );
}

#[test]
fn a_shared_gpu_runs_one_qos_policy_as_hami_does() {
    // TestCheckDeviceQos at the usage level: (name, holders' policies,
    // the plugin's report, the pod's policy, fits).
    type Case = (
        &'static str,
        &'static [Option<QosPolicy>],
        Option<QosPolicy>,
        Option<QosPolicy>,
        bool,
    );
    let cases: [Case; 6] = [
        ("check no use device", &[], BURST, BEST_EFFORT, true),
        ("check fail", &[BURST], None, BEST_EFFORT, false),
        ("check pass", &[BEST_EFFORT], None, BEST_EFFORT, true),
        (
            "the holders decide, not a stale report",
            &[BEST_EFFORT],
            BURST,
            BEST_EFFORT,
            true,
        ),
        (
            "a holder that names no policy lets any in (HAMi's \"\")",
            &[None],
            None,
            BURST,
            true,
        ),
        (
            "no pod asks a policy: the plugin's report decides",
            &[],
            BURST,
            BEST_EFFORT,
            true,
        ),
    ];
    for (name, holders, reported, asked, fits) in cases {
        let mut gpu = sgpus(1);
        for &held in holders {
            hold(&mut gpu, 0, None, held, 10);
        }
        assert_eq!(gpu.usage[0].takes_qos(reported, asked), fits, "{name}");
    }
    // Only online pods on the GPU: the plugin's report decides.
    let mut online_only = sgpus(1);
    hold(&mut online_only, 0, ONLINE, None, 0);
    assert!(!online_only.usage[0].takes_qos(BURST, BEST_EFFORT));
    assert!(online_only.usage[0].takes_qos(BURST, BURST));
    assert!(online_only.usage[0].takes_qos(None, BEST_EFFORT));

    // Through Fit, with the reason.
    let mut gpus = sgpus(2);
    hold(&mut gpus, 0, None, BURST, 10);
    hold(&mut gpus, 1, None, BURST, 10);
    let reason = place(
        &gpus,
        one_sgpu("50"),
        annotations(None, Some("best-effort")),
    )
    .unwrap_err();
    assert!(
        reason.contains("2 MetaX sGPUs running sGPUs of another QoS policy than metax-tech.com/sgpu-qos-policy \"best-effort\""),
        "{reason}"
    );
    let got = place(
        &gpus,
        one_sgpu("50"),
        annotations(None, Some("burst-share")),
    );
    expect("same policy", got, Ok(&["dev-0"]));
    // An exclusive sGPU needs an empty GPU, whatever the policies
    // ("check request exclusive" passes the QoS check, then fails on use).
    let got = place(
        &gpus,
        one_sgpu("100"),
        annotations(None, Some("best-effort")),
    );
    expect(
        "exclusive on used GPUs",
        got,
        Err("in use, but 100 cores needs an empty MetaX sGPU"),
    );
}

#[test]
fn online_pods_are_charged_no_cores_and_prefer_the_quietest_gpu() {
    // HAMi's Fit: an online pod skips the core checks and holds 0 cores.
    let mut full = sgpus(1);
    hold(&mut full, 0, OFFLINE, BEST_EFFORT, 50);
    hold(&mut full, 0, OFFLINE, BEST_EFFORT, 50);
    // An offline pod asking no cores may not join (every core handed out).
    let reason = place(
        &full,
        one_sgpu("0"),
        annotations(Some("offline"), Some("best-effort")),
    )
    .unwrap_err();
    assert!(reason.contains("with every core handed out"), "{reason}");
    let request = parse_pod(
        &pod(one_sgpu("50"), annotations(Some("online"), None)),
        &config(),
    )
    .unwrap()
    .unwrap();
    let placed = fit(&full, &request, SchedulingPolicy::Spread).expect("online skips cores");
    assert_eq!(placed.containers[0].slices[0].cores, 0);

    // TestPrioritizeOnlineDevices: the idle GPU, then fewer online pods,
    // then fewer offline ones; a GPU of only offline pods last.
    let mut gpus = sgpus(4);
    hold(&mut gpus, 0, OFFLINE, BEST_EFFORT, 10);
    hold(&mut gpus, 1, ONLINE, None, 0);
    hold(&mut gpus, 1, ONLINE, None, 0);
    hold(&mut gpus, 2, ONLINE, None, 0);
    hold(&mut gpus, 2, OFFLINE, BEST_EFFORT, 10);
    let mut order = Vec::new();
    let mut left = gpus.clone();
    for _ in 0..4 {
        let request = parse_pod(
            &pod(one_sgpu("10"), annotations(Some("online"), None)),
            &config(),
        )
        .unwrap()
        .unwrap();
        let placed = fit(&left, &request, SchedulingPolicy::Binpack).unwrap();
        let device = placed.containers[0].slices[0].device;
        order.push(left.devices[device].uuid.clone());
        // Take it out of the race: fill its sGPUs.
        left.usage[device].slices = 4;
    }
    assert_eq!(order, ["dev-3", "dev-2", "dev-1", "dev-0"]);
}

#[test]
fn online_scores_follow_hamis_table() {
    // TestScoreOnlineDevices: idle 0, two online -40, two offline -200,
    // two of each -44.
    for (name, holders, want) in [
        ("test idle device", &[][..], 0),
        ("test only online device", &[ONLINE, ONLINE], -40),
        ("test only offline device", &[OFFLINE, OFFLINE], -200),
        (
            "test online/offline device",
            &[OFFLINE, OFFLINE, ONLINE, ONLINE],
            -44,
        ),
    ] {
        let mut gpu = sgpus(1);
        for &class in holders {
            hold(&mut gpu, 0, class, None, 0);
        }
        assert_eq!(online_score(&gpu, &BTreeSet::from([0])), want, "{name}");
    }
}

#[test]
fn exclusive_scores_follow_hamis_table() {
    // TestScoreExclusiveDevices: (name, MetaLink per GPU, GPUs in use,
    // GPUs taken, score).
    type Case = (
        &'static str,
        &'static [u32],
        &'static [usize],
        &'static [usize],
        i64,
    );
    let cases: [Case; 7] = [
        (
            "allocate one device, rest zero device",
            &[1, 1, 1, 1],
            &[0, 1, 2],
            &[3],
            0,
        ),
        (
            "allocate one device, rest three device",
            &[1, 1, 1, 1],
            &[],
            &[3],
            -30,
        ),
        (
            "allocate two device, best result",
            &[1, 1, 1, 1],
            &[],
            &[2, 3],
            60,
        ),
        (
            "allocate two device, bad result",
            &[1, 1, 1, 1, 2, 2, 2, 2],
            &[0, 1, 2, 5, 6, 7],
            &[3, 4],
            0,
        ),
        (
            "allocate four device, best result",
            &[1, 1, 1, 1, 2],
            &[],
            &[0, 1, 2, 3],
            600,
        ),
        (
            "allocate four device, bad result",
            &[1, 1, 1, 2, 2],
            &[],
            &[1, 2, 3, 4],
            180,
        ),
        (
            "allocate eight device",
            &[1, 1, 1, 1, 2, 2, 2, 2],
            &[],
            &[0, 1, 2, 3, 4, 5, 6, 7],
            1200,
        ),
    ];
    for (name, links, used, taken, want) in cases {
        let mut gpus = sgpus(links.len());
        for (device, link) in gpus.devices.iter_mut().zip(links) {
            device.network_id = Some(*link);
        }
        for &d in used {
            hold(&mut gpus, d, None, None, 100);
        }
        let taken: BTreeSet<usize> = taken.iter().copied().collect();
        assert_eq!(exclusive_score(&gpus, &taken), want, "{name}");
    }
}

#[test]
fn nodes_are_ranked_by_metax_topology_across_the_candidates() {
    // Topology-aware exclusive sGPUs: a node whose free GPUs share a
    // MetaLink beats one whose GPUs are on none.
    let linked = {
        let mut gpus = sgpus(2);
        for device in &mut gpus.devices {
            device.network_id = Some(1);
        }
        gpus
    };
    let unlinked = sgpus(2);
    let request = parse_pod(
        &pod(
            json!({"metax-tech.com/sgpu": "2"}),
            json!({"metax-tech.com/sgpu-topology-aware": "true"}),
        ),
        &config(),
    )
    .unwrap()
    .unwrap();
    let policy = SchedulingPolicy::Spread;
    let mut scores = vec![
        topology_score(&linked, &request, policy, policy),
        topology_score(&unlinked, &request, policy, policy),
    ];
    assert_eq!(scores, [Some(100.0), Some(0.0)]);
    normalize_topology(&mut scores);
    assert_eq!(scores, [Some(1.0), Some(0.0)]);
    // Without the annotation (and the configuration's default false) the
    // pod is not scored by topology.
    let plain = parse_pod(
        &pod(json!({"metax-tech.com/sgpu": "2"}), json!({})),
        &config(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(topology_score(&linked, &plain, policy, policy), None);

    // Whole GPUs: the plugin's maps, by how many GPUs the pod takes.
    let whole = |loss: i64, score: i64| {
        let mut gpus = node(
            DeviceFamily::Metax,
            "Metax-GPU",
            &[
                Row {
                    count: 1,
                    total_mem: 65536,
                    ..FREE
                },
                Row {
                    id: "dev-1",
                    count: 1,
                    total_mem: 65536,
                    ..FREE
                },
            ],
        );
        gpus.placement_scores = vec![PlacementScore {
            devices: 2,
            loss: Some(loss),
            score: Some(score),
        }];
        gpus
    };
    let two = parse_pod(
        &pod(json!({"metax-tech.com/gpu": "2"}), json!({})),
        &config(),
    )
    .unwrap()
    .unwrap();
    let (a, b) = (whole(10, 90), whole(30, 50));
    let under = |node_policy| {
        let mut s = vec![
            topology_score(&a, &two, policy, node_policy),
            topology_score(&b, &two, policy, node_policy),
        ];
        normalize_topology(&mut s);
        s
    };
    // Binpack: the node losing less; spread: the node scoring higher.
    assert_eq!(under(SchedulingPolicy::Binpack), [Some(1.0), Some(0.0)]);
    assert_eq!(
        under(SchedulingPolicy::Spread),
        [Some(1.0), Some(0.0)],
        "a has the higher score"
    );
    let (c, d) = (whole(10, 10), whole(30, 50));
    let mut s = vec![
        topology_score(&c, &two, policy, SchedulingPolicy::Spread),
        topology_score(&d, &two, policy, SchedulingPolicy::Spread),
    ];
    normalize_topology(&mut s);
    assert_eq!(s, [Some(0.0), Some(1.0)]);
    // A single GPU: the maps list no 1, which reads 0 as in HAMi.
    let one = parse_pod(
        &pod(json!({"metax-tech.com/gpu": "1"}), json!({})),
        &config(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        topology_score(&a, &one, policy, SchedulingPolicy::Binpack),
        Some(0.0)
    );
    // Equal scores everywhere: topology does not separate the nodes.
    let mut same = vec![Some(-3.0), None, Some(-3.0)];
    normalize_topology(&mut same);
    assert_eq!(same, [Some(1.0), None, Some(1.0)]);
}

proptest! {
    /// Whatever MetaX pods come, in any order, no GPU ever mixes pods with
    /// and without an app class, takes an offline pod after an online one,
    /// or runs shared sGPUs of two QoS policies; and no GPU is overbooked.
    #[test]
    fn metax_colocation_rules_always_hold(
        pods in prop::collection::vec((0u8..3, 0u8..4, prop::sample::select(vec![10u32, 50, 100])), 1..40),
    ) {
        let mut gpus = sgpus(3);
        for (class, qos, cores) in pods {
            let class = [None, Some("online"), Some("offline")][usize::from(class)];
            let qos = [None, Some("best-effort"), Some("fixed-share"), Some("burst-share")][usize::from(qos)];
            let limits = one_sgpu(&cores.to_string());
            let Ok(Some(request)) = parse_pod(&pod(limits, annotations(class, qos)), &config()) else {
                continue;
            };
            let before = gpus.clone();
            let Ok(placed) = fit(&gpus, &request, SchedulingPolicy::Binpack) else {
                continue;
            };
            for slice in placed.slices() {
                let was = &before.usage[slice.device];
                if class == Some("offline") {
                    prop_assert_eq!(was.online, 0, "an offline pod joined an online GPU");
                }
                gpus.charge(slice);
            }
            prop_assert!(gpus.within_capacity());
            for used in &gpus.usage {
                let classed = used.online + used.offline;
                prop_assert!(classed == 0 || classed == used.slices, "{:?}", used);
                let policies = used.qos_holders[1..].iter().filter(|h| **h > 0).count();
                prop_assert!(used.qos_holders[0] > 0 || policies <= 1, "{:?}", used);
            }
        }
    }
}
