//! Vendor topology scores (HAMi's device `ScoreNode`s): how well the
//! devices a pod would get on a node fit together, 0.0 to 1.0, for the
//! families HAMi scores by topology. Prioritize ranks nodes by it first.

use tessera_api::{
    names::kunlun,
    request::PodRequest,
    v1alpha1::{DeviceFamily, SchedulingPolicy},
};

use super::{NodeGpus, Placement, fit};

/// The pod's topology score on `node` (the mean over the scored families),
/// or `None` when no container asks for a family HAMi scores by topology
/// (Ascend 910 by `NetworkID`, Kunlunxin whole XPUs by wing) or the pod
/// does not fit.
pub fn topology_score(
    node: &NodeGpus,
    request: &PodRequest,
    policy: SchedulingPolicy,
) -> Option<f64> {
    let scored = |c: &tessera_api::request::ContainerRequest| {
        c.vendor.as_ref().is_some_and(|v| {
            v.by_network || (v.by_wing && v.device_type.as_deref() == Some(kunlun::XPU_TYPE))
        })
    };
    if !request.containers.iter().any(scored) {
        return None;
    }
    let placement = fit(node, request, policy).ok()?;
    let mut scores = Vec::new();
    if let Some(score) = network_score(node, request, &placement) {
        scores.push(score);
    }
    if let Some(score) = wing_score(node, &placement) {
        scores.push(score);
    }
    (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64)
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
