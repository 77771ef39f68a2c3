//! Device-aware preemption: which lower-priority pods a pod must displace
//! to fit a node's actual devices, and which node costs least.
//!
//! kube-scheduler's own preemption cannot answer this for GPU slices: the
//! device resources are the extender's (`ignoredByScheduler`), so its dry
//! run sees every pod fit already and finds no victims. This is the same
//! algorithm over the ledger's devices (kube-scheduler's
//! `SelectVictimsOnNode`): release every lower-priority pod; if the pod then
//! fits, give back as many as possible, those whose eviction would violate a
//! PodDisruptionBudget first, each group from the highest priority down. No
//! victim is left that could be given back on its own. Nodes compare as
//! kube-scheduler compares candidates: fewest PDB violations, then the
//! lowest highest-victim priority, then fewest victims, then fewest slices.
//!
//! Pure logic; `extender::preempt` acts on it.

use crate::request::PodRequest;
use tessera_api::v1alpha1::SchedulingPolicy;

use super::{fit::fit, node::NodeGpus, placement::Slice};

/// A pod holding slices on the node, which might be displaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    /// Its priority (`spec.priority`).
    pub priority: i32,
    /// Its slices on the node's devices.
    pub slices: Vec<Slice>,
    /// Whether evicting it would violate a PodDisruptionBudget.
    pub violates_pdb: bool,
}

/// What displacing pods on one node costs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Positions of the victims in the candidates given.
    pub victims: Vec<usize>,
    /// Victims whose eviction violates a PodDisruptionBudget.
    pub pdb_violations: usize,
    /// The highest priority among the victims.
    pub highest_priority: i32,
    /// The victims' slices, in all.
    pub slices: usize,
}

impl Choice {
    /// The order kube-scheduler ranks candidates in (smaller is better).
    pub fn rank(&self) -> (usize, i32, usize, usize) {
        (
            self.pdb_violations,
            self.highest_priority,
            self.victims.len(),
            self.slices,
        )
    }
}

/// The pods of `candidates` a pod of `priority` must displace to fit
/// `node` under `policy`; `None` when even displacing every lower-priority
/// pod is not enough, or when it fits without displacing anyone.
pub fn on_node(
    node: &NodeGpus,
    request: &PodRequest,
    policy: SchedulingPolicy,
    priority: i32,
    candidates: &[Victim],
) -> Option<Choice> {
    if fit(node, request, policy).is_ok() {
        return None;
    }
    let mut eligible: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].priority < priority)
        .collect();
    if eligible.is_empty() {
        return None;
    }
    let mut without = node.clone();
    for &i in &eligible {
        for slice in &candidates[i].slices {
            without.release(slice);
        }
    }
    fit(&without, request, policy).ok()?;
    // Give back the PDB-protected first, each group from the highest
    // priority down (ties: the larger holder first, then position).
    eligible.sort_by_key(|&i| {
        let v = &candidates[i];
        (
            !v.violates_pdb,
            std::cmp::Reverse(v.priority),
            std::cmp::Reverse(v.slices.len()),
            i,
        )
    });
    let mut victims = Vec::new();
    for i in eligible {
        for slice in &candidates[i].slices {
            without.charge(slice);
        }
        if fit(&without, request, policy).is_err() {
            for slice in &candidates[i].slices {
                without.release(slice);
            }
            victims.push(i);
        }
    }
    victims.sort_unstable();
    Some(Choice {
        pdb_violations: victims
            .iter()
            .filter(|&&i| candidates[i].violates_pdb)
            .count(),
        highest_priority: victims
            .iter()
            .map(|&i| candidates[i].priority)
            .max()
            .unwrap_or(i32::MIN),
        slices: victims.iter().map(|&i| candidates[i].slices.len()).sum(),
        victims,
    })
}

/// The cheapest of several nodes' choices, by kube-scheduler's order; ties
/// go to the first given.
pub fn best<N>(choices: impl IntoIterator<Item = (N, Choice)>) -> Option<(N, Choice)> {
    choices.into_iter().fold(
        None,
        |best: Option<(N, Choice)>, (node, choice)| match best {
            Some((_, ref kept)) if kept.rank() <= choice.rank() => best,
            _ => Some((node, choice)),
        },
    )
}
