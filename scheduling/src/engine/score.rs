//! How full a device or node is, and the node score the extender reports.

use crate::request::ScoringWeights;
use tessera_api::v1alpha1::SchedulingPolicy;

use super::{
    node::{DeviceUsage, GpuDevice, NodeGpus},
    placement::Slice,
};

/// kube-scheduler's extender scores range over 0..=10 (`MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

/// HAMi's device score (`ComputeScore`), which orders a node's devices for
/// a slice: the weighted sum of the slice, core and memory fractions the
/// device would hold with `slice` added (a fraction of a device without
/// that capacity counts 0). Higher is fuller; only the order matters.
pub fn device_score(
    device: &GpuDevice,
    used: &DeviceUsage,
    slice: &Slice,
    weights: ScoringWeights,
) -> f64 {
    let fraction = |held: f64, total: f64| if total > 0.0 { held / total } else { 0.0 };
    let slots = fraction(
        f64::from(used.slices) + f64::from(slice.units.max(1)),
        f64::from(device.split_count),
    );
    let cores = fraction(
        f64::from(used.cores) + f64::from(slice.cores),
        f64::from(device.cores),
    );
    let memory = fraction(
        used.memory_mib as f64 + slice.memory_mib as f64,
        device.memory_mib as f64,
    );
    weights.slot as f64 * slots + weights.core as f64 * cores + weights.memory as f64 * memory
}

/// The node's score under the node policy: binpack favours full nodes,
/// spread empty ones. Nodes without GPUs score 0.
pub fn node_score(node: &NodeGpus, policy: SchedulingPolicy) -> i64 {
    scaled(node, policy, 0, MAX_SCORE)
}

/// The policy's preference for `node` (0.0 to 1.0: fuller nodes near 1 under
/// binpack, emptier ones under spread) scaled onto `low..=high`, rounded;
/// nodes without GPUs score 0.
fn scaled(node: &NodeGpus, policy: SchedulingPolicy, low: i64, high: i64) -> i64 {
    if node.devices.is_empty() {
        return 0;
    }
    let fullness = node_fullness(node);
    let preference = match policy {
        SchedulingPolicy::Binpack => fullness,
        SchedulingPolicy::Spread => 1.0 - fullness,
    };
    (low as f64 + preference * (high - low) as f64)
        .round()
        .clamp(low as f64, high as f64) as i64
}

/// How full a node is, 0.0 to 1.0: the mean of its memory, core and slice
/// fractions over all its devices.
fn node_fullness(node: &NodeGpus) -> f64 {
    let mut totals = [(0.0, 0.0); 3];
    for (device, used) in node.devices.iter().zip(&node.usage) {
        totals[0].0 += used.memory_mib as f64;
        totals[0].1 += device.memory_mib as f64;
        totals[1].0 += f64::from(used.cores);
        totals[1].1 += f64::from(device.cores);
        totals[2].0 += f64::from(used.slices);
        totals[2].1 += f64::from(device.split_count);
    }
    mean_fraction(totals)
}

/// The score Prioritize reports: while a Bind is in the node's
/// bind-to-Allocate window (its NodeLock is held, or a Bind of this replica
/// works on it) 0, below every node that could take the pod at once, which
/// score 1 to 10 by the policy. A pod sent to a pending node would wait for
/// the lock; under binpack a burst of pods all prefer the same fullest node
/// and would bind one at a time (measured at 1,000 nodes: up to 48 pods of a
/// burst on one node, lock wait p50 5 s).
///
/// With a vendor `topology` score (0.0 to 1.0, [`super::topology::topology_score`])
/// the topology ranks first, as HAMi's device scores outweigh its node
/// score: three tiers (worst, middle, best) of three policy steps, 1 to 9.
pub fn prioritized_score(
    node: &NodeGpus,
    policy: SchedulingPolicy,
    pending: bool,
    topology: Option<f64>,
) -> i64 {
    if pending || node.devices.is_empty() {
        return 0;
    }
    match topology {
        None => scaled(node, policy, 1, MAX_SCORE),
        Some(t) => 1 + 3 * (t.clamp(0.0, 1.0) * 2.0).round() as i64 + scaled(node, policy, 0, 2),
    }
}

fn mean_fraction(parts: [(f64, f64); 3]) -> f64 {
    let sum: f64 = parts
        .iter()
        .map(|(used, total)| {
            if *total > 0.0 {
                (used / total).min(1.0)
            } else {
                1.0
            }
        })
        .sum();
    sum / parts.len() as f64
}
