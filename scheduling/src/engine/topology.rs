//! Vendor topology scores (HAMi's device `ScoreNode`s): how well the
//! devices a pod would get on a node fit together, higher is better, for the
//! families HAMi scores by topology. Prioritize compares them over the
//! candidate nodes ([`normalize`]) and ranks nodes by them first.

use std::collections::BTreeSet;

use crate::request::{ContainerRequest, PodRequest};
use tessera_api::{
    names::{kunlun, metax},
    v1alpha1::{DeviceFamily, SchedulingPolicy, Sharing},
};

use super::{
    fit::fit,
    node::NodeGpus,
    placement::{EXCLUSIVE_CORES, Placement},
};

/// The pod's topology score on `node` (the sum over the scored families,
/// as HAMi adds its device scores), or `None` when no container asks for
/// a family HAMi scores by topology (Ascend 910 by `NetworkID`, Kunlunxin
/// whole XPUs by wing, MetaX online sGPUs by their neighbours,
/// topology-aware exclusive sGPUs by MetaLink, whole GPUs by the plugin's
/// losses or scores) or the pod does not fit. Devices are placed under
/// `gpu_policy`; MetaX's whole-GPU maps are read under `node_policy`.
/// Ascend's and Kunlunxin's are 0.0 to 1.0; MetaX's are HAMi's own.
pub fn topology_score(
    node: &NodeGpus,
    request: &PodRequest,
    gpu_policy: SchedulingPolicy,
    node_policy: SchedulingPolicy,
) -> Option<f64> {
    let whole_metax = |c: &ContainerRequest| {
        c.family == DeviceFamily::Metax
            && c.vendor.as_ref().and_then(|v| v.device_type.as_deref()) == Some(metax::GPU_TYPE)
            && !node.placement_scores.is_empty()
    };
    if !request
        .containers
        .iter()
        .any(|c| scored(c) || whole_metax(c))
    {
        return None;
    }
    let placement = fit(node, request, gpu_policy).ok()?;
    let scores = [
        network_score(node, request, &placement),
        wing_score(node, &placement),
        metax_score(node, request, &placement),
        metax_gpu_score(node, &placement, node_policy),
    ];
    scores
        .into_iter()
        .flatten()
        .reduce(|sum, score| sum + score)
}

/// Whether HAMi scores the container's devices by topology.
fn scored(c: &ContainerRequest) -> bool {
    c.vendor.as_ref().is_some_and(|v| {
        v.by_network
            || (v.by_wing && v.device_type.as_deref() == Some(kunlun::XPU_TYPE))
            || v.topology_aware
            || v.sharing.is_some_and(Sharing::is_online)
    })
}

/// Topology scores of the candidate nodes onto 0.0 (the worst among them)
/// to 1.0 (the best), as HAMi compares its raw scores between nodes; all
/// 1.0 when they are equal. Nodes without a score keep `None`.
pub fn normalize(scores: &mut [Option<f64>]) {
    let known = scores.iter().flatten().copied();
    let (low, high) = known.fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), s| {
        (low.min(s), high.max(s))
    });
    for score in scores.iter_mut().flatten() {
        *score = if high > low {
            (*score - low) / (high - low)
        } else {
            1.0
        };
    }
}

/// MetaX sGPUs (HAMi's sGPU `ScoreNode`): for an online pod, its GPUs'
/// neighbours (`scoreOnlineDevices`: -100 per offline pod on a GPU with
/// only offline pods, else -20 per online and -2 per offline pod); else,
/// for topology-aware exclusive sGPUs, how well they keep MetaLinks whole
/// (`scoreExclusiveDevices`).
fn metax_score(node: &NodeGpus, request: &PodRequest, placement: &Placement) -> Option<f64> {
    let sgpus = |want: &dyn Fn(&ContainerRequest) -> bool| -> BTreeSet<usize> {
        request
            .containers
            .iter()
            .zip(&placement.containers)
            .filter(|(c, _)| want(c))
            .flat_map(|(_, placed)| &placed.slices)
            .filter(|s| is_sgpu(node, s.device))
            .map(|s| s.device)
            .collect()
    };
    let online = sgpus(&|c| {
        c.vendor
            .as_ref()
            .is_some_and(|v| v.sharing.is_some_and(Sharing::is_online))
    });
    if !online.is_empty() {
        return Some(online_score(node, &online) as f64);
    }
    let exclusive = sgpus(&|c| {
        c.cores >= EXCLUSIVE_CORES && c.vendor.as_ref().is_some_and(|v| v.topology_aware)
    });
    if exclusive.is_empty() {
        return None;
    }
    Some(exclusive_score(node, &exclusive) as f64)
}

/// HAMi's `scoreOnlineDevices` over the GPUs an online pod gets, from
/// what they run before it.
pub(super) fn online_score(node: &NodeGpus, devices: &BTreeSet<usize>) -> i64 {
    devices
        .iter()
        .map(|&d| {
            let used = &node.usage[d];
            let (on, off) = (i64::from(used.online), i64::from(used.offline));
            if off > 0 && on == 0 {
                -100 * off
            } else {
                -20 * on - 2 * off
            }
        })
        .sum()
}

/// HAMi's `scoreExclusiveDevices`: 10 × the MetaLink pairs among the GPUs
/// taken, less the pairs of free GPUs that taking them breaks.
pub(super) fn exclusive_score(node: &NodeGpus, exclusive: &BTreeSet<usize>) -> i64 {
    let free: Vec<usize> = (0..node.devices.len())
        .filter(|&d| is_sgpu(node, d) && node.usage[d].slices == 0)
        .collect();
    let allocated = link_pairs(node, exclusive.iter().copied());
    let available = link_pairs(node, free.iter().copied());
    let rest = link_pairs(
        node,
        free.iter().copied().filter(|d| !exclusive.contains(d)),
    );
    let loss = available - allocated - rest;
    10 * allocated - loss
}

/// MetaX whole GPUs (HAMi's GPU `ScoreNode`): by the plugin's map for
/// the number of GPUs the pod takes (a count it does not list reads 0):
/// under binpack the less topology lost the better, under spread the
/// higher the plugin's score. `None` on a node whose plugin writes no map.
fn metax_gpu_score(
    node: &NodeGpus,
    placement: &Placement,
    policy: SchedulingPolicy,
) -> Option<f64> {
    let taken = placement
        .slices()
        .filter(|s| {
            let d = &node.devices[s.device];
            d.family == DeviceFamily::Metax && d.model == metax::GPU_TYPE
        })
        .count();
    if taken == 0 || node.placement_scores.is_empty() {
        return None;
    }
    let entry = node
        .placement_scores
        .iter()
        .find(|p| p.devices as usize == taken);
    Some(match policy {
        SchedulingPolicy::Binpack => -entry.and_then(|p| p.loss).unwrap_or(0) as f64,
        SchedulingPolicy::Spread => entry.and_then(|p| p.score).unwrap_or(0) as f64,
    })
}

fn is_sgpu(node: &NodeGpus, device: usize) -> bool {
    let d = &node.devices[device];
    d.family == DeviceFamily::Metax && d.model == metax::SGPU_TYPE
}

/// HAMi's `LinkDevices.Score`: 10 for each pair of `devices` on one
/// MetaLink (the device's network; none is no MetaLink).
fn link_pairs(node: &NodeGpus, devices: impl Iterator<Item = usize>) -> i64 {
    let zones: Vec<u32> = devices
        .map(|d| node.devices[d].network_id.unwrap_or(0))
        .collect();
    let mut score = 0;
    for (i, a) in zones.iter().enumerate() {
        for b in &zones[i + 1..] {
            if *a != 0 && a == b {
                score += 10;
            }
        }
    }
    score
}

/// Ascend 910 (HAMi's ascend `ScoreNode`): per container, the share of its
/// NPUs on its most used network; the mean over such containers. `None`
/// when a container's NPUs do not all report a network.
fn network_score(node: &NodeGpus, request: &PodRequest, placement: &Placement) -> Option<f64> {
    let mut shares = Vec::new();
    for (wanted, placed) in request.containers.iter().zip(&placement.containers) {
        if !wanted.vendor.as_ref().is_some_and(|v| v.by_network) || placed.slices.is_empty() {
            continue;
        }
        let mut counts: Vec<(u32, usize)> = Vec::new();
        for slice in &placed.slices {
            let network = node.devices[slice.device].network_id?;
            match counts.iter_mut().find(|(n, _)| *n == network) {
                Some((_, count)) => *count += 1,
                None => counts.push((network, 1)),
            }
        }
        let most = counts.iter().map(|(_, c)| *c).max().unwrap_or(0);
        shares.push(most as f64 / placed.slices.len() as f64);
    }
    (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64)
}

/// Kunlunxin whole XPUs (HAMi's kunlun `ScoreNode`, `calcscore`): compares
/// the wing "bubbles" of the XPUs the pod gets with those already in use;
/// 3000, 2000, 1000 or 0 in HAMi, here 1, 2/3, 1/3 or 0.
fn wing_score(node: &NodeGpus, placement: &Placement) -> Option<f64> {
    let whole = |i: usize| {
        let d = &node.devices[i];
        d.family == DeviceFamily::Kunlunxin && d.model == kunlun::XPU_TYPE
    };
    let current: Vec<u32> = placement
        .slices()
        .filter(|s| whole(s.device))
        .map(|s| node.devices[s.device].index)
        .collect();
    if current.is_empty() {
        return None;
    }
    let previous: Vec<u32> = (0..node.devices.len())
        .filter(|&i| whole(i) && node.usage[i].slices > 0)
        .map(|i| node.devices[i].index)
        .collect();
    Some(wing_change(&previous, &current))
}

/// HAMi's `calcscore` over 3000: how the pod's XPUs' wing bubbles compare
/// with those of the XPUs in use.
fn wing_change(previous: &[u32], current: &[u32]) -> f64 {
    let score = match bubbles(current) - bubbles(previous) {
        -1 => 3.0,
        0 => 2.0,
        2 => 0.0,
        _ => 1.0,
    };
    score / 3.0
}

/// HAMi's `countbubble`: per wing, 0 for four XPUs, 2 for one, else 1; 1
/// for none at all.
fn bubbles(indexes: &[u32]) -> i64 {
    let left = indexes.iter().filter(|&&i| i < 4).count();
    let right = indexes.len() - left;
    if left == 0 && right == 0 {
        return 1;
    }
    let value = |n: usize| match n {
        4 => 0,
        1 => 2,
        _ => 1,
    };
    value(left) + value(right)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hamis_wing_bubbles_and_scores() {
        // HAMi's TestCountbubble and TestCalcscore.
        for (indexes, want) in [
            (vec![], 1),
            (vec![0, 1, 2, 3], 1),
            (vec![0], 3),
            (vec![4], 3),
            (vec![0, 1], 2),
        ] {
            assert_eq!(bubbles(&indexes), want, "{indexes:?}");
        }
        for (previous, current, want) in [
            (vec![0], vec![0, 1], 3000.0),
            (vec![0], vec![4], 2000.0),
            (vec![0, 1], vec![0], 1000.0),
            (vec![0, 1, 2, 3], vec![0], 0.0),
        ] {
            assert_eq!(
                wing_change(&previous, &current) * 3000.0,
                want,
                "{previous:?} {current:?}"
            );
        }
    }
}
