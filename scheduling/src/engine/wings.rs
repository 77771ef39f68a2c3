//! Kunlunxin's XPU topology (HAMi `pkg/device/kunlun/topo.go`,
//! `graghSelect`): a node's eight XPUs form two wings, 0-3 and 4-7, fully
//! linked within a wing; across wings XPU `i` links to `i + 4`, and six
//! sets of four span both wings.
//!
//! Which XPUs a container of 1, 2 or 4 gets: one wing when a wing has
//! enough, preferring the wing that the choice fills most exactly (for one
//! XPU a wing with 1 free, then 3, 2, 4; for two, 2, 3, 4; for four, 4), so
//! whole wings stay free for larger pods; otherwise a linked set across the
//! wings. Eight takes all. Pure, and in HAMi's order.

/// XPUs linked across the wings.
const CROSS_PAIRS: [[u32; 2]; 4] = [[0, 4], [1, 5], [2, 6], [3, 7]];
/// XPUs linked within a wing.
const WING_PAIRS: [[u32; 2]; 12] = [
    [0, 1],
    [0, 2],
    [0, 3],
    [1, 2],
    [1, 3],
    [2, 3],
    [4, 5],
    [4, 6],
    [4, 7],
    [5, 6],
    [5, 7],
    [6, 7],
];
/// Sets of four linked across the wings.
const QUADS: [[u32; 4]; 6] = [
    [0, 1, 4, 5],
    [2, 3, 6, 7],
    [0, 2, 4, 6],
    [1, 3, 5, 7],
    [0, 3, 4, 7],
    [1, 2, 5, 6],
];
/// For an odd count, which wing sizes are tried, in order.
const ODD_ORDER: [usize; 4] = [1, 3, 2, 4];

/// The XPU indexes a container of `count` gets from the `fitting` ones
/// (indexes in ascending order); `None` when no allowed set is free.
pub(super) fn select(fitting: &[u32], count: usize) -> Option<Vec<u32>> {
    let left: Vec<u32> = fitting.iter().copied().filter(|&i| i < 4).collect();
    let right: Vec<u32> = fitting
        .iter()
        .copied()
        .filter(|&i| (4..8).contains(&i))
        .collect();
    match count {
        8 => (left.len() + right.len() == 8).then(|| (0..8).collect()),
        1 | 2 | 4 => {
            if left.len() >= count || right.len() >= count {
                for slots in count..=4 {
                    let size = if count % 2 == 1 {
                        ODD_ORDER[slots - 1]
                    } else {
                        slots
                    };
                    if left.len() == size {
                        return Some(left[..count].to_vec());
                    }
                    if right.len() == size {
                        return Some(right[..count].to_vec());
                    }
                }
            }
            linked(&[left, right].concat(), count)
        }
        _ => None,
    }
}

/// Across the wings (HAMi's `interconnect`): two XPUs `i`, `i + 4`; four
/// from a linked set of four, with six free preferring a set that leaves
/// the other two linked.
fn linked(free: &[u32], count: usize) -> Option<Vec<u32>> {
    let has_all = |set: &[u32], among: &[u32]| set.iter().all(|i| among.contains(i));
    match count {
        2 => free.iter().find_map(|&i| {
            let pair = CROSS_PAIRS.iter().find(|p| p.contains(&i))?;
            let partner = if pair[0] == i { pair[1] } else { pair[0] };
            free.contains(&partner).then(|| vec![i, partner])
        }),
        4 if matches!(free.len(), 4 | 5) => QUADS
            .iter()
            .find(|q| has_all(q.as_slice(), free))
            .map(|q| q.to_vec()),
        4 if free.len() == 6 => {
            let mut last = None;
            for quad in QUADS.iter().filter(|q| has_all(q.as_slice(), free)) {
                let rest: Vec<u32> = free.iter().copied().filter(|i| !quad.contains(i)).collect();
                if CROSS_PAIRS
                    .iter()
                    .chain(&WING_PAIRS)
                    .any(|p| has_all(p, &rest))
                {
                    return Some(quad.to_vec());
                }
                last = Some(quad.to_vec());
            }
            last
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The free XPUs when `used` are taken (HAMi's `newDevices`).
    fn free_but(used: &[u32]) -> Vec<u32> {
        (0..8).filter(|i| !used.contains(i)).collect()
    }

    /// Case, fitting XPUs, count, the choice.
    type Row = (&'static str, Vec<u32>, usize, Option<Vec<u32>>);

    #[test]
    fn hamis_topology_cases() {
        // HAMi's topo_test.go and device_test.go graghSelect cases.
        let rows: [Row; 12] = [
            ("all eight", free_but(&[]), 8, Some((0..8).collect())),
            ("eight but one used", free_but(&[0]), 8, None),
            (
                "one of eight: the left wing first",
                free_but(&[]),
                1,
                Some(vec![0]),
            ),
            (
                "one: the wing with exactly one free",
                free_but(&[4, 5, 6]),
                1,
                Some(vec![7]),
            ),
            (
                "one: a wing of three before a wing of four",
                free_but(&[0]),
                1,
                Some(vec![1]),
            ),
            ("two: a wing of two", free_but(&[0, 1]), 2, Some(vec![2, 3])),
            (
                "four from the left wing",
                free_but(&[4]),
                4,
                Some(vec![0, 1, 2, 3]),
            ),
            (
                "two across the wings when no wing has two",
                vec![1, 5],
                2,
                Some(vec![1, 5]),
            ),
            (
                "four across: the only linked set",
                vec![0, 1, 4, 5],
                4,
                Some(vec![0, 1, 4, 5]),
            ),
            (
                "four of six: a set leaving a linked pair",
                vec![0, 1, 2, 4, 5, 6],
                4,
                Some(vec![0, 1, 4, 5]),
            ),
            ("three is never placed", free_but(&[]), 3, None),
            ("two with no link", vec![0, 5], 2, None),
        ];
        for (case, fitting, count, want) in rows {
            assert_eq!(select(&fitting, count), want, "{case}");
        }
    }

    #[test]
    fn every_choice_is_free_distinct_and_of_the_count() {
        for mask in 0u32..256 {
            let fitting: Vec<u32> = (0..8).filter(|i| mask & (1 << i) != 0).collect();
            for count in [1, 2, 4, 8] {
                if let Some(chosen) = select(&fitting, count) {
                    assert_eq!(chosen.len(), count, "{fitting:?} {count}");
                    assert!(chosen.iter().all(|i| fitting.contains(i)));
                    let mut unique = chosen.clone();
                    unique.sort_unstable();
                    unique.dedup();
                    assert_eq!(unique.len(), count);
                } else if count == 1 {
                    assert!(fitting.is_empty(), "one free XPU is always placed");
                }
            }
        }
    }
}
