//! Whom device-aware preemption displaces, over the ledger: per node, the
//! fewest lower-priority pods whose release lets the pod fit its devices
//! ([`engine::preempt`]), and the cheapest node, sampled as kube-scheduler
//! samples. No API calls; `preempt` acts on what this decides.

use std::collections::HashSet;

use tessera_api::v1alpha1::SchedulingPolicy;
use tessera_scheduling::request::PodRequest;

use crate::{
    engine::{
        self, NodeGpus,
        preempt::{self, Choice, Victim},
    },
    projection::{AllocationKey, Ledger, LiveAllocation, Projection, engine_slices},
};

/// A pod whose release lets the preemptor fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Displaced {
    /// Its namespace and name.
    pub key: AllocationKey,
    /// Its UID (the delete is conditional on it).
    pub uid: String,
    /// Its priority.
    pub priority: i32,
}

/// Where the pod goes and whom it displaces there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The node.
    pub node: String,
    /// The pods to displace, in the order the ledger lists them.
    pub victims: Vec<Displaced>,
    /// What it costs, as kube-scheduler ranks it.
    pub choice: Choice,
}

/// The cheapest node of `nodes` to preempt on, over the ledger: each node's
/// lower-priority pods (with a recorded priority, not themselves holds) are
/// candidates, those in `protected` counting as PodDisruptionBudget
/// violations. `None` when no node can be made to fit.
pub fn plan<'n>(
    ledger: &Ledger,
    request: &PodRequest,
    policy: SchedulingPolicy,
    priority: i32,
    nodes: impl IntoIterator<Item = &'n str>,
    protected: &HashSet<AllocationKey>,
) -> Option<Plan> {
    plan_counting(ledger, request, policy, priority, nodes, protected).0
}

/// [`plan`], and on how many of the nodes preemption would work.
fn plan_counting<'n>(
    ledger: &Ledger,
    request: &PodRequest,
    policy: SchedulingPolicy,
    priority: i32,
    nodes: impl IntoIterator<Item = &'n str>,
    protected: &HashSet<AllocationKey>,
) -> (Option<Plan>, usize) {
    let mut freeable = 0;
    let choices = nodes.into_iter().filter_map(|name| {
        let gpus = ledger.node(name)?;
        let (held, candidates) = candidates(ledger, name, gpus, priority, protected);
        let choice = preempt::on_node(gpus, request, policy, priority, &candidates)?;
        freeable += 1;
        Some(((name, held), choice))
    });
    let best = preempt::best(choices);
    let plan = best.map(|((node, held), choice)| Plan {
        node: node.to_owned(),
        victims: choice
            .victims
            .iter()
            .map(|&i| displaced(held[i], priority))
            .collect(),
        choice,
    });
    (plan, freeable)
}

/// A victim as the preemptor acts on it.
fn displaced((key, held): (&AllocationKey, &LiveAllocation), below: i32) -> Displaced {
    Displaced {
        key: key.clone(),
        uid: held.pod_uid.clone(),
        priority: held.priority.unwrap_or(below),
    }
}

/// How many nodes [`plan_sampled`] reads under one hold of the ledger's
/// read lock: a Bind waiting to write waits for one batch (a few
/// milliseconds), not for the whole decision.
const BATCH: usize = 256;

/// How many nodes where preemption works are enough to choose from among
/// `nodes`: kube-scheduler's DefaultPreemption defaults
/// (`minCandidateNodesPercentage` 10, `minCandidateNodesAbsolute` 100).
pub fn enough_candidates(nodes: usize) -> usize {
    (nodes / 10).max(100)
}

/// [`plan`] as kube-scheduler's DefaultPreemption samples: from the node at
/// `start` on (wrapping around; the preemptor's own offset, so that
/// preemptions spread over the cluster), a batch at a time, each under its
/// own read of the ledger, until [`enough_candidates`] nodes where
/// preemption works were seen; the best of those, ties to the earliest.
/// What changes between batches is caught by the hold, which places the
/// pod again under the write lock.
pub fn plan_sampled(
    projection: &Projection,
    request: &PodRequest,
    policy: SchedulingPolicy,
    priority: i32,
    (nodes, start): (&[String], usize),
    protected: &HashSet<AllocationKey>,
) -> Option<Plan> {
    let start = start.checked_rem(nodes.len())?;
    let order: Vec<&str> = nodes[start..]
        .iter()
        .chain(&nodes[..start])
        .map(String::as_str)
        .collect();
    let enough = enough_candidates(nodes.len());
    let mut best: Option<Plan> = None;
    let mut seen = 0;
    for batch in order.chunks(BATCH) {
        let ledger = projection.read();
        let (plan, freeable) = plan_counting(
            &ledger,
            request,
            policy,
            priority,
            batch.iter().copied(),
            protected,
        );
        drop(ledger);
        seen += freeable;
        if let Some(plan) = plan
            && best
                .as_ref()
                .is_none_or(|kept| plan.choice.rank() < kept.choice.rank())
        {
            best = Some(plan);
        }
        if seen >= enough {
            break;
        }
    }
    best
}

/// kube-scheduler's own victims on `node` (by UID, from its dry run, which
/// knows CPU and memory but not GPU slices) made enough for the pod's GPU
/// slices: the pods to displace beside them, the fewest that let it fit,
/// as [`plan`] picks them. `None` when even displacing every lower-priority
/// pod there is not enough.
pub fn beside(
    ledger: &Ledger,
    request: &PodRequest,
    policy: SchedulingPolicy,
    priority: i32,
    node: &str,
    theirs: &HashSet<&str>,
    protected: &HashSet<AllocationKey>,
) -> Option<(Vec<Displaced>, Choice)> {
    let gpus = ledger.node(node)?;
    let mut without = gpus.clone();
    for (_, allocation) in ledger.allocations_on(node) {
        if theirs.contains(allocation.pod_uid.as_str()) {
            crate::projection::release_allocation(&mut without, allocation);
        }
    }
    if engine::fit(&without, request, policy).is_ok() {
        let none = Choice {
            victims: Vec::new(),
            pdb_violations: 0,
            highest_priority: i32::MIN,
            slices: 0,
        };
        return Some((Vec::new(), none));
    }
    let (held, candidates): (Vec<_>, Vec<_>) = {
        let (held, candidates) = candidates(ledger, node, &without, priority, protected);
        held.into_iter()
            .zip(candidates)
            .filter(|((_, a), _)| !theirs.contains(a.pod_uid.as_str()))
            .unzip()
    };
    let choice = preempt::on_node(&without, request, policy, priority, &candidates)?;
    Some((
        choice
            .victims
            .iter()
            .map(|&i| displaced(held[i], priority))
            .collect(),
        choice,
    ))
}

/// The pods on `node` a pod of `priority` may displace, with their slices
/// as the engine counts them on `gpus`.
fn candidates<'l>(
    ledger: &'l Ledger,
    node: &str,
    gpus: &NodeGpus,
    priority: i32,
    protected: &HashSet<AllocationKey>,
) -> (Vec<(&'l AllocationKey, &'l LiveAllocation)>, Vec<Victim>) {
    ledger
        .allocations_on(node)
        .filter(|(_, a)| !a.nominated)
        .filter_map(|(key, a)| {
            let held = a.priority.filter(|&p| p < priority)?;
            let victim = Victim {
                priority: held,
                slices: engine_slices(gpus, a),
                violates_pdb: protected.contains(key),
            };
            Some(((key, a), victim))
        })
        .unzip()
}
