//! Device-aware victim selection: exactly the pods whose slices the
//! preemptor needs, never one that does not help, PDBs and priorities as
//! kube-scheduler weighs them.

use crate::request::{PodRequest, parse_pod};
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use serde_json::json;
use tessera_api::v1alpha1::{DeviceFamily, SchedulingPolicy};

use super::preempt::{Choice, Victim, best, on_node};
use super::vendor_tests::{FREE, Row, config, node, pod};
use super::*;

const SPREAD: SchedulingPolicy = SchedulingPolicy::Spread;

fn gpus(n: usize) -> NodeGpus {
    let rows: Vec<Row> = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"][..n]
        .iter()
        .map(|id| Row {
            id,
            count: 10,
            total_mem: 80_000,
            ..FREE
        })
        .collect();
    node(DeviceFamily::Nvidia, "A100", &rows)
}

fn request(limits: serde_json::Value) -> PodRequest {
    parse_pod(&pod(limits, json!({})), &config())
        .unwrap()
        .unwrap()
}

/// Places a pod of `priority` asking `mib` on `device`, returning it as a candidate.
fn hold(node: &mut NodeGpus, device: usize, mib: u64, priority: i32) -> Victim {
    let slice = Slice::plain(device, mib, 0);
    node.charge(&slice);
    Victim {
        priority,
        slices: vec![slice],
        violates_pdb: false,
    }
}

#[test]
fn only_the_pods_on_the_gpu_that_frees_count() {
    // gpu-0 holds 60,000 MiB in two pods, gpu-1 70,000 in two; a pod of
    // 50,000 MiB needs one pod gone from one GPU.
    let mut node = gpus(2);
    let candidates = vec![
        hold(&mut node, 0, 30_000, 5),
        hold(&mut node, 0, 30_000, 1),
        hold(&mut node, 1, 40_000, 1),
        hold(&mut node, 1, 30_000, 1),
    ];
    let big = request(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}));
    let choice = on_node(&node, &big, SPREAD, 10, &candidates).unwrap();
    // Freeing gpu-0's priority-1 pod or gpu-1's 40,000 MiB pod each
    // leaves 50,000 free; the priority-5 pod is given back first and stays.
    assert_eq!(choice.victims.len(), 1, "{choice:?}");
    assert_ne!(choice.victims, [0], "the higher-priority pod stays");
    assert_eq!(choice.highest_priority, 1);
}

#[test]
fn higher_or_equal_priority_pods_are_never_victims() {
    let mut node = gpus(1);
    let candidates = vec![
        hold(&mut node, 0, 50_000, 10),
        hold(&mut node, 0, 20_000, 3),
    ];
    let big = request(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000"}));
    assert_eq!(
        on_node(&node, &big, SPREAD, 10, &candidates),
        None,
        "only the 20,000 MiB pod is lower; freeing it leaves 30,000"
    );
    let fits = request(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "25000"}));
    let choice = on_node(&node, &fits, SPREAD, 10, &candidates).unwrap();
    assert_eq!(choice.victims, [1]);
    let small = request(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}));
    assert_eq!(
        on_node(&node, &small, SPREAD, 10, &candidates),
        None,
        "fits already: nothing to displace"
    );
}

#[test]
fn a_pdb_protected_pod_is_kept_when_another_will_do() {
    let mut node = gpus(1);
    let mut protected = hold(&mut node, 0, 40_000, 1);
    protected.violates_pdb = true;
    let candidates = vec![protected, hold(&mut node, 0, 40_000, 2)];
    let half = request(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000"}));
    let choice = on_node(&node, &half, SPREAD, 10, &candidates).unwrap();
    assert_eq!(
        (choice.victims.clone(), choice.pdb_violations),
        (vec![1], 0),
        "the unprotected pod goes although its priority is higher"
    );
    // When both must go, the violation is counted.
    let whole = request(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "80000"}));
    let choice = on_node(&node, &whole, SPREAD, 10, &candidates).unwrap();
    assert_eq!((choice.victims, choice.pdb_violations), (vec![0, 1], 1));
}

#[test]
fn nodes_rank_by_violations_then_priority_then_count_then_slices() {
    let choice = |pdb, prio, n, slices| Choice {
        victims: (0..n).collect(),
        pdb_violations: pdb,
        highest_priority: prio,
        slices,
    };
    let picked = best([
        ("a", choice(1, 0, 1, 1)),
        ("b", choice(0, 5, 1, 1)),
        ("c", choice(0, 3, 3, 3)),
        ("d", choice(0, 3, 2, 4)),
        ("e", choice(0, 3, 2, 2)),
        ("f", choice(0, 3, 2, 2)),
    ]);
    assert_eq!(picked.map(|(n, _)| n), Some("e"));
    assert_eq!(best::<&str>([]), None);
}

proptest! {
    /// Whatever the node holds, the victims chosen are all of lower
    /// priority, the pod fits once they go, and none of them could stay:
    /// giving any one back makes the pod not fit.
    #[test]
    fn victims_are_needed_sufficient_and_lower(
        held in proptest::collection::vec((0usize..2, 1u64..40_000, 0i32..8), 0..10),
        ask in 1u64..80_000,
        priority in 0i32..8,
    ) {
        let mut node = gpus(2);
        let mut candidates = Vec::new();
        for (device, mib, prio) in held {
            if node.usage[device].memory_mib + mib <= 80_000 {
                candidates.push(hold(&mut node, device, mib, prio));
            }
        }
        let pod = request(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": ask.to_string()}));
        if let Some(choice) = on_node(&node, &pod, SPREAD, priority, &candidates) {
            let mut after = node.clone();
            for &i in &choice.victims {
                prop_assert!(candidates[i].priority < priority);
                for slice in &candidates[i].slices {
                    after.release(slice);
                }
            }
            prop_assert!(fit(&after, &pod, SPREAD).is_ok());
            for &i in &choice.victims {
                let mut kept = after.clone();
                for slice in &candidates[i].slices {
                    kept.charge(slice);
                }
                prop_assert!(fit(&kept, &pod, SPREAD).is_err(), "victim {} was not needed", i);
            }
        }
    }
}
