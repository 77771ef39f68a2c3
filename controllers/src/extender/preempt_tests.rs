//! Preemption over the ledger: which node and pods `plan` picks, and the
//! hold that keeps the freed slices for the preemptor alone.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tessera_api::v1alpha1::{OperatingMode, SchedulingPolicy};
use tessera_scheduling::request::{PodRequest, parse_pod};

use super::filter::filter;
use super::victims::{Displaced, plan};
use super::wire::ExtenderArgs;
use crate::{
    config::Config,
    engine::GpuDevice,
    projection::{AllocationKey, Feeder, LiveAllocation, Projection, UuidSlice},
};

const SPREAD: SchedulingPolicy = SchedulingPolicy::Spread;

fn gpu(node: &str, index: u32) -> GpuDevice {
    GpuDevice {
        cordoned: false,
        family: Default::default(),
        network_id: None,
        uuid: format!("GPU-{node}-{index}"),
        index,
        model: "NVIDIA A100-SXM4-80GB".into(),
        memory_mib: 80_000,
        cores: 100,
        split_count: 10,
        numa_node: None,
        healthy: true,
        mode: OperatingMode::HamiCore,
        mig: None,
        mig_present: 0,
        profiles: Vec::new(),
        minor: None,
        qos_policy: None,
    }
}

fn key(name: &str) -> AllocationKey {
    AllocationKey {
        namespace: "team".into(),
        name: name.into(),
    }
}

/// A pod of `priority` holding `mib` on GPU `index` of `node`.
fn held(node: &str, index: u32, mib: u64, priority: Option<i32>) -> LiveAllocation {
    LiveAllocation {
        pod_uid: format!("uid-{node}-{index}-{mib}"),
        node: node.into(),
        slices: vec![UuidSlice {
            uuid: format!("GPU-{node}-{index}"),
            memory_mib: mib,
            cores: 0,
            mig: None,
            core_indexes: Vec::new(),
            units: 1,
            sharing: None,
            mutex: false,
        }],
        priority,
        ..LiveAllocation::default()
    }
}

fn pod(name: &str, mib: u64) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")},
        "spec": {"priority": 1000, "containers": [{"name": "main", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string(),
        }}}]},
    }))
    .unwrap()
}

fn request(mib: u64) -> PodRequest {
    parse_pod(&pod("p", mib), &Config::default().request)
        .unwrap()
        .unwrap()
}

/// Two nodes of two 80,000 MiB GPUs, every GPU holding 60,000 MiB:
/// n1 in two pods of priority 10 on GPU 0 and one of 500 on GPU 1;
/// n2 in one pod of priority 100 per GPU.
fn cluster() -> (Projection, Feeder) {
    let (projection, feeder) = Projection::new();
    feeder.mark_all_synced();
    {
        let mut ledger = feeder.write();
        for node in ["n1", "n2"] {
            ledger.set_node(node, vec![gpu(node, 0), gpu(node, 1)]);
        }
        ledger.insert_allocation(key("n1-a"), held("n1", 0, 30_000, Some(10)));
        ledger.insert_allocation(key("n1-b"), held("n1", 0, 30_001, Some(10)));
        ledger.insert_allocation(key("n1-c"), held("n1", 1, 60_000, Some(500)));
        ledger.insert_allocation(key("n2-a"), held("n2", 0, 60_000, Some(100)));
        ledger.insert_allocation(key("n2-b"), held("n2", 1, 60_000, Some(100)));
    }
    (projection, feeder)
}

fn victims(plan: &super::victims::Plan) -> Vec<&str> {
    plan.victims.iter().map(|v| v.key.name.as_str()).collect()
}

#[test]
fn the_node_needing_the_fewest_and_lowest_victims_is_chosen() {
    let (projection, _feeder) = cluster();
    let ledger = projection.read();
    let nodes = ["n1", "n2"];
    // 55,000 MiB: n1 frees GPU 0 by displacing both pods of priority 10
    // (one is not enough); n2 frees a GPU with one pod of priority 100.
    // Fewest victims is not first: the lowest highest-victim priority is.
    let chosen = plan(
        &ledger,
        &request(55_000),
        SPREAD,
        1000,
        nodes,
        &HashSet::new(),
    )
    .unwrap();
    assert_eq!(chosen.node, "n1");
    assert_eq!(victims(&chosen), ["n1-a", "n1-b"]);
    assert_eq!(chosen.choice.highest_priority, 10);
    // 21,000 MiB: one pod of priority 10 frees enough, so only one goes.
    let chosen = plan(
        &ledger,
        &request(21_000),
        SPREAD,
        1000,
        nodes,
        &HashSet::new(),
    )
    .unwrap();
    assert_eq!(chosen.node, "n1");
    assert_eq!(chosen.victims.len(), 1);
    assert_eq!(
        chosen.victims[0],
        Displaced {
            key: key("n1-b"),
            uid: "uid-n1-0-30001".into(),
            priority: 10,
        },
        "n1-a is given back first (it alone leaves room), so only n1-b goes"
    );
}

#[test]
fn only_lower_priorities_with_a_recorded_priority_are_victims() {
    let (projection, feeder) = cluster();
    // A preemptor of priority 100 may displace only n1's priority-10 pods.
    let chosen = plan(
        &projection.read(),
        &request(55_000),
        SPREAD,
        100,
        ["n2", "n1"],
        &HashSet::new(),
    )
    .unwrap();
    assert_eq!(chosen.node, "n1");
    assert_eq!(victims(&chosen), ["n1-a", "n1-b"]);
    // Allocations written before priorities were recorded, DRA mirrors
    // and holds are never displaced.
    {
        let mut ledger = feeder.write();
        ledger.insert_allocation(key("n1-a"), held("n1", 0, 30_000, None));
        let mut hold = held("n1", 0, 30_001, Some(1));
        hold.nominated = true;
        ledger.insert_allocation(key("n1-b"), hold);
    }
    let ledger = projection.read();
    let none = plan(
        &ledger,
        &request(55_000),
        SPREAD,
        100,
        ["n1", "n2"],
        &HashSet::new(),
    );
    assert_eq!(none, None, "equal priorities (n2) are not displaced either");
}

#[test]
fn pods_a_disruption_budget_protects_are_spared_where_another_node_serves() {
    let (projection, _feeder) = cluster();
    let ledger = projection.read();
    let protected: HashSet<_> = [key("n1-a")].into();
    // n1 would violate the budget; n2 costs a higher priority but no
    // violation, and violations weigh first.
    let chosen = plan(
        &ledger,
        &request(55_000),
        SPREAD,
        1000,
        ["n1", "n2"],
        &protected,
    )
    .unwrap();
    assert_eq!(chosen.node, "n2");
    assert_eq!(chosen.choice.pdb_violations, 0);
    assert_eq!(chosen.victims.len(), 1);
}

#[test]
fn freed_slices_are_held_for_the_preemptor_alone() {
    let (projection, feeder) = cluster();
    let config = Config::default();
    let urgent = pod("urgent", 70_000);
    let args = |pod: &Pod| ExtenderArgs {
        pod: pod.clone(),
        nodes: None,
        node_names: Some(vec!["n1".into()]),
    };
    let fits = |pod: &Pod| {
        let answer = filter(&projection, &config, &args(pod));
        assert!(answer.error.is_empty(), "{answer:?}");
        answer.node_names == Some(vec!["n1".to_owned()])
    };
    // The hold: n1's GPU 0 without its two victims takes the pod.
    let victims = [key("n1-a"), key("n1-b")];
    let request = request(70_000);
    projection
        .hold(&key("urgent"), "uid-urgent", "n1", &victims, |node, _| {
            let node = node.unwrap();
            let placement =
                crate::engine::fit(node, &request, SPREAD).map_err(|r| r.to_string())?;
            assert_eq!(placement.slices().next().unwrap().device, 0);
            let mut hold = held("n1", 0, 70_000, Some(1000));
            hold.pod_uid = "uid-urgent".into();
            hold.nominated = true;
            Ok::<_, String>(((), hold))
        })
        .unwrap();
    // While the victims terminate, nobody fits, the preemptor neither: its
    // slices are not free yet.
    let sneaky = pod("sneaky", 25_000);
    assert!(!fits(&sneaky));
    assert!(!fits(&urgent));
    // Once they are gone, the preemptor fits into its hold; a pod that
    // would have fitted the freed GPU does not (10,000 MiB are left there).
    for victim in &victims {
        feeder.write().remove_allocation(victim, None);
    }
    assert!(!fits(&sneaky));
    assert!(fits(&urgent));
    assert!(fits(&pod("small", 10_000)), "what the hold leaves is free");
    // A later pod of the same name is not the preemptor.
    let mut impostor = urgent.clone();
    impostor.metadata.uid = Some("uid-other".into());
    assert!(!fits(&impostor));
}

#[test]
fn kube_schedulers_victims_are_completed_only_as_far_as_the_gpus_need() {
    let (projection, _feeder) = cluster();
    let ledger = projection.read();
    let none = HashSet::new();
    let uid = |name: &str| ledger.allocation(&key(name)).unwrap().pod_uid.clone();
    let (a, b) = (uid("n1-a"), uid("n1-b"));
    // kube-scheduler displaces n1-a for CPU: 49,999 MiB of GPU 0 are free with
    // it, so a pod of 50,000 MiB needs n1-b too.
    let theirs: HashSet<&str> = [a.as_str()].into();
    let (extra, _) = super::victims::beside(
        &ledger,
        &request(50_000),
        SPREAD,
        1000,
        "n1",
        &theirs,
        &none,
    )
    .unwrap();
    assert_eq!(
        extra
            .iter()
            .map(|d| d.key.name.as_str())
            .collect::<Vec<_>>(),
        ["n1-b"]
    );
    // Both of theirs free enough: nothing more.
    let theirs: HashSet<&str> = [a.as_str(), b.as_str()].into();
    let (extra, choice) = super::victims::beside(
        &ledger,
        &request(50_000),
        SPREAD,
        1000,
        "n1",
        &theirs,
        &none,
    )
    .unwrap();
    assert!(extra.is_empty());
    assert_eq!(choice.pdb_violations, 0);
    // No lower-priority pods left to add on n2 (priority 100 against 100):
    // the node is dropped.
    let n2a = uid("n2-a");
    let theirs: HashSet<&str> = [n2a.as_str()].into();
    assert!(
        super::victims::beside(&ledger, &request(90_000), SPREAD, 100, "n2", &theirs, &none)
            .is_none(),
        "90,000 MiB fit no GPU whatever is displaced"
    );
}

#[test]
fn a_sample_of_nodes_is_decided_in_batches_as_kube_scheduler_samples() {
    let (projection, feeder) = Projection::new();
    let names: Vec<String> = (0..700).map(|n| format!("b{n:03}")).collect();
    {
        let mut ledger = feeder.write();
        for (n, node) in names.iter().enumerate() {
            ledger.set_node(node, vec![gpu(node, 0)]);
            // Every node full; the victims' priority falls with the index
            // in steps, so several nodes are equally cheap.
            let priority = 600 - i32::try_from(n / 100).unwrap();
            ledger.insert_allocation(key(node), held(node, 0, 80_000, Some(priority)));
        }
    }
    let request = request(10_000);
    let sampled = |start: usize| {
        super::victims::plan_sampled(
            &projection,
            &request,
            SPREAD,
            1000,
            (&names, start),
            &HashSet::new(),
        )
        .unwrap()
    };
    let over = |range: std::ops::Range<usize>| {
        plan(
            &projection.read(),
            &request,
            SPREAD,
            1000,
            names[range].iter().map(String::as_str),
            &HashSet::new(),
        )
        .unwrap()
    };
    // 700 nodes: 100 freeable ones are enough, so one batch of 256 is read.
    assert_eq!(super::victims::enough_candidates(700), 100);
    assert_eq!(sampled(0), over(0..256));
    assert_eq!(sampled(0).node, "b200", "the first of the cheapest read");
    assert_eq!(sampled(500), over(500..700).min_by_rank(over(0..56)));
    assert_eq!(sampled(500).node, "b600");
    // With few freeable nodes, every batch is read: the same as all at once.
    let few = &names[..150];
    let all = super::victims::plan_sampled(
        &projection,
        &request,
        SPREAD,
        1000,
        (few, 0),
        &HashSet::new(),
    );
    assert_eq!(all, Some(over(0..150)));
}

trait MinByRank {
    fn min_by_rank(self, other: Self) -> Self;
}

impl MinByRank for super::victims::Plan {
    /// The cheaper of two plans, ties to `self`.
    fn min_by_rank(self, other: Self) -> Self {
        if other.choice.rank() < self.choice.rank() {
            other
        } else {
            self
        }
    }
}

#[test]
fn a_hold_replaced_by_bind_leaves_the_new_reservation_and_comes_back_if_bind_fails() {
    use kube::runtime::watcher::Event;
    use tessera_api::testing::{allocation, container, slice};

    let (projection, feeder) = cluster();
    let hold = allocation("urgent", "uid-urgent", "n1")
        .namespace("team")
        .container(container("main", vec![slice("GPU-n1-0", 0, 70_000, 0)]))
        .held_until("2026-03-01T12:00:00Z".parse().unwrap())
        .build();
    let mut relist = crate::projection::AllocationRelist::default();
    feeder.allocation_event(Event::Apply(hold.clone()), &mut relist);
    let entry = |projection: &Projection| projection.read().allocation(&key("urgent")).cloned();
    assert!(entry(&projection).unwrap().nominated);
    // Bind places the pod (on n1's GPU 1 here) in place of its hold.
    let reserve = |node: &str| {
        projection
            .assume(&key("urgent"), "uid-urgent", node, |_, _| {
                let mut mine = held(node, 1, 10_000, Some(1000));
                mine.pod_uid = "uid-urgent".into();
                Ok::<_, String>(((), mine))
            })
            .unwrap();
    };
    reserve("n1");
    // Bind deletes the hold to create the allocation: the hold's deletion
    // leaves Bind's reservation alone.
    feeder.allocation_event(Event::Delete(hold.clone()), &mut relist);
    let kept = entry(&projection).expect("Bind's reservation is kept");
    assert!(!kept.nominated);
    assert_eq!(kept.slices[0].uuid, "GPU-n1-1");
    // A Bind that fails before replacing the hold: the hold comes back.
    projection.forget(&key("urgent"), "uid-urgent", "n1");
    assert_eq!(entry(&projection), None);
    projection.restore(&hold);
    assert!(entry(&projection).unwrap().nominated);
    // A hold that lapses (Released) goes.
    let mut lapsed = hold.clone();
    lapsed.status = Some(tessera_api::v1alpha1::VgpuAllocationStatus {
        phase: Some(tessera_api::v1alpha1::AllocationPhase::Released),
        ..Default::default()
    });
    feeder.allocation_event(Event::Apply(lapsed), &mut relist);
    assert_eq!(entry(&projection), None);
}

#[test]
fn filter_records_the_pods_it_finds_no_gpu_for_until_one_fits() {
    let (projection, feeder) = cluster();
    let config = Config::default();
    let ask = |pod: &Pod| {
        filter(
            &projection,
            &config,
            &ExtenderArgs {
                pod: pod.clone(),
                nodes: None,
                node_names: Some(vec!["n1".into(), "n2".into()]),
            },
        )
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let waiting = |projection: &Projection| -> Vec<String> {
        projection
            .waiting()
            .at(now, |_| false)
            .into_iter()
            .map(|w| format!("{}/{} {:?}", w.namespace, w.name, w.lack))
            .collect()
    };
    // 30,000 MiB fits nowhere (every GPU holds 60,000 of 80,000); 10,000 does.
    let big = pod("big", 30_000);
    assert!(ask(&big).node_names.unwrap().is_empty());
    assert!(!ask(&pod("small", 10_000)).node_names.unwrap().is_empty());
    // Every GPU lacked the memory.
    assert_eq!(waiting(&projection), ["team/big Some(Memory)"]);
    // n2's pods go: big fits, and waits no longer.
    {
        let mut ledger = feeder.write();
        ledger.remove_allocation(&key("n2-a"), None);
    }
    assert_eq!(ask(&big).node_names.unwrap(), ["n2"]);
    assert!(waiting(&projection).is_empty());
}

/// Review 2026-12-01, H3: a pod with nothing of lower priority to displace
/// on any node costs no reads at all (before, every attempt listed every
/// PodDisruptionBudget and each one's pods first).
#[test]
fn nothing_is_planned_or_read_where_no_lower_priority_allocation_is() {
    let (projection, _feeder) = cluster();
    let ledger = projection.read();
    let nodes = ["n1".to_owned(), "n2".to_owned()];
    assert!(super::preempt::lower_priority_on(&ledger, &nodes, 11));
    assert!(
        !super::preempt::lower_priority_on(&ledger, &nodes, 10),
        "equal is not lower"
    );
    assert!(!super::preempt::lower_priority_on(
        &ledger,
        &nodes[1..],
        100
    ));
    assert!(!super::preempt::lower_priority_on(
        &ledger,
        &["n9".to_owned()],
        1000
    ));
}

/// Review 2026-12-01, H4: an allocation names its pod, and a node agent
/// could write one naming any pod; the victim read back must be that pod,
/// bound to the plan's node, of a lower priority, or nothing is done.
#[test]
fn a_victim_is_displaced_only_as_the_pod_its_allocation_names() {
    let victim = Displaced {
        key: key("v"),
        uid: "uid-v".into(),
        priority: 10,
    };
    let read = |uid: &str, node: Option<&str>, priority: i32| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "team", "uid": uid, "labels": {"app": "a"}},
            "spec": {"nodeName": node, "priority": priority, "containers": []},
        }))
        .unwrap()
    };
    let labels =
        super::preempt::victim_labels(Some(&read("uid-v", Some("n1"), 10)), &victim, "n1", 100)
            .unwrap();
    assert_eq!(labels["app"], "a");
    for (pod, what) in [
        (None, "gone"),
        (
            Some(read("uid-other", Some("n1"), 10)),
            "another pod of the name",
        ),
        (Some(read("uid-v", Some("n2"), 10)), "bound elsewhere"),
        (Some(read("uid-v", None, 10)), "not bound"),
        (
            Some(read("uid-v", Some("n1"), 100)),
            "not of lower priority",
        ),
    ] {
        assert!(
            super::preempt::victim_labels(pod.as_ref(), &victim, "n1", 100).is_err(),
            "{what}"
        );
    }
}

/// Review 2026-12-01, M4: the preempt verb answered kube-scheduler's
/// victims (and Tessera's) although the hold failed because the pod is over
/// its namespace's quota (a percentage counted as 0 MiB by the early gate),
/// so pods were deleted for a pod that could never bind. Now it answers none.
#[tokio::test]
async fn the_preempt_verb_answers_no_victim_when_the_hold_fails() {
    let (projection, feeder) = cluster();
    let quota: k8s_openapi::api::core::v1::ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpus", "namespace": "team"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}},
    }))
    .unwrap();
    feeder.quota_event(kube::runtime::watcher::Event::Apply(quota), &mut Vec::new());
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let config = std::sync::Arc::new(Config::default());
    let preemptor = super::preempt::Preemptor::new(
        client,
        projection.clone(),
        config.clone(),
        super::metrics::ExtenderMetrics::register(
            &mut prometheus_client::registry::Registry::default(),
        ),
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "urgent", "namespace": "team", "uid": "uid-urgent"},
        "spec": {"priority": 1000, "containers": [{"name": "main", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50",
        }}}]},
    }))
    .unwrap();
    let theirs = super::wire::MetaVictims {
        pods: vec![super::wire::MetaPod {
            uid: "uid-n1-0-30000".into(),
        }],
        num_pdb_violations: 0,
    };
    let args = super::wire::ExtenderPreemptionArgs {
        pod,
        node_name_to_victims: None,
        node_name_to_meta_victims: Some([("n1".to_owned(), theirs)].into()),
    };
    let answer = preemptor.answer(&args).await.unwrap();
    assert!(
        answer.node_name_to_meta_victims.is_empty(),
        "over its quota, the pod preempts nothing: {answer:?}"
    );
}
