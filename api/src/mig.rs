//! MIG geometry, pure: NVIDIA's profile tables for the MIG-capable GPUs
//! Tessera knows, and the placement rules the scheduler and the node agent
//! share.
//!
//! A GPU has `memory_slices` memory slices (8 on A100, H100 and H200). An
//! instance of a profile occupies `memory_slices` consecutive slices starting
//! at one of the profile's allowed placements, and no two instances may share
//! a slice. The tables are NVIDIA's (`nvidia-smi mig -lgip` and `-lgipp`);
//! the placement rules alone keep compute slices within the GPU's 7.
//!
//! Occupancy is a bit mask over memory slices ([`Mask`]), so the checks are
//! a few instructions and the engine's usage type stays `Copy`.

use crate::v1alpha1::{MigLayout, MigPlacement, MigProfile};

/// The most memory slices a GPU may have (and a [`Mask`] can hold).
pub const MAX_MEMORY_SLICES: u32 = 8;

/// Occupied memory slices, bit `i` for slice `i`.
pub type Mask = u8;

/// The mask of the slices a placement covers; `None` when it does not fit
/// within [`MAX_MEMORY_SLICES`] (a placement from an untrusted object).
pub fn span(placement: MigPlacement) -> Option<Mask> {
    let end = placement.start.checked_add(placement.size)?;
    if placement.size == 0 || end > MAX_MEMORY_SLICES {
        return None;
    }
    let ones = (1u16 << placement.size) - 1;
    Mask::try_from(ones << placement.start).ok()
}

/// The slices a set of placements covers together; a placement off the GPU
/// (see [`span`]) covers nothing.
pub fn occupied(placements: impl IntoIterator<Item = MigPlacement>) -> Mask {
    placements
        .into_iter()
        .filter_map(span)
        .fold(0, |mask, span| mask | span)
}

/// One row of a profile table: name, NVML id, compute slices, memory slices,
/// memory (MiB), most instances, allowed starts, media extensions.
type Row = (&'static str, u32, u32, u32, u64, u32, &'static [u32], bool);

/// A100-SXM4-80GB and A100 80GB PCIe.
const A100_80GB: &[Row] = &[
    ("1g.10gb", 19, 1, 1, 9728, 7, &[0, 1, 2, 3, 4, 5, 6], false),
    (
        "1g.10gb+me",
        20,
        1,
        1,
        9728,
        1,
        &[0, 1, 2, 3, 4, 5, 6],
        true,
    ),
    ("1g.20gb", 15, 1, 2, 19968, 4, &[0, 2, 4, 6], false),
    ("2g.20gb", 14, 2, 2, 19968, 3, &[0, 2, 4], false),
    ("3g.40gb", 9, 3, 4, 40192, 2, &[0, 4], false),
    ("4g.40gb", 5, 4, 4, 40192, 1, &[0], false),
    ("7g.80gb", 0, 7, 8, 80896, 1, &[0], false),
];

/// A100-SXM4-40GB and A100-PCIE-40GB: the same profile IDs and placements
/// as the 80GB board, half the memory per slice (the sizes of the MIG user
/// guide's `nvidia-smi mig -lgip` example on this board).
const A100_40GB: &[Row] = &[
    ("1g.5gb", 19, 1, 1, 4864, 7, &[0, 1, 2, 3, 4, 5, 6], false),
    ("1g.5gb+me", 20, 1, 1, 4864, 1, &[0, 1, 2, 3, 4, 5, 6], true),
    ("1g.10gb", 15, 1, 2, 9856, 4, &[0, 2, 4, 6], false),
    ("2g.10gb", 14, 2, 2, 9856, 3, &[0, 2, 4], false),
    ("3g.20gb", 9, 3, 4, 19968, 2, &[0, 4], false),
    ("4g.20gb", 5, 4, 4, 19968, 1, &[0], false),
    ("7g.40gb", 0, 7, 8, 40192, 1, &[0], false),
];

/// H100 80GB (SXM5 HBM3 and PCIe).
const H100_80GB: &[Row] = &[
    ("1g.10gb", 19, 1, 1, 9984, 7, &[0, 1, 2, 3, 4, 5, 6], false),
    (
        "1g.10gb+me",
        20,
        1,
        1,
        9984,
        1,
        &[0, 1, 2, 3, 4, 5, 6],
        true,
    ),
    ("1g.20gb", 15, 1, 2, 20096, 4, &[0, 2, 4, 6], false),
    ("2g.20gb", 14, 2, 2, 20096, 3, &[0, 2, 4], false),
    ("3g.40gb", 9, 3, 4, 40448, 2, &[0, 4], false),
    ("4g.40gb", 5, 4, 4, 40448, 1, &[0], false),
    ("7g.80gb", 0, 7, 8, 81152, 1, &[0], false),
];

/// The extended resource a MIG profile's instances are offered as under
/// `migStrategy: mixed`, NVIDIA's device plugin's name: `nvidia.com/mig-`
/// and the profile, `+` (media extensions) written `.` as resource names
/// allow (`1g.10gb+me` → `nvidia.com/mig-1g.10gb.me`).
pub fn resource_name(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// The MIG layout of a GPU model, matched on the model name NVML reports
/// (`NVIDIA A100-SXM4-80GB`, `NVIDIA H100 80GB HBM3`); `None` for a model
/// Tessera has no table for. The memory sizes are NVML's `memorySizeMB` as
/// `nvidia-smi mig -lgip` prints them on those boards. The NVML backend
/// reads every table from the GPU itself; these serve the fake GPUs.
pub fn layout_for_model(model: &str) -> Option<MigLayout> {
    let model = model.to_ascii_uppercase();
    let rows = if model.contains("A100") && model.contains("80GB") {
        A100_80GB
    } else if model.contains("A100") && model.contains("40GB") {
        A100_40GB
    } else if model.contains("H100") && model.contains("80GB") {
        H100_80GB
    } else {
        return None;
    };
    Some(MigLayout {
        memory_slices: 8,
        compute_slices: 7,
        profiles: rows
            .iter()
            .map(
                |&(name, id, compute, memory, mib, max, starts, media)| MigProfile {
                    name: name.to_owned(),
                    id,
                    memory_mib: mib,
                    compute_slices: compute,
                    memory_slices: memory,
                    max_instances: max,
                    placements: starts.to_vec(),
                    media,
                },
            )
            .collect(),
    })
}

/// Whether a layout can be used for placement: at most
/// [`MAX_MEMORY_SLICES`] slices and every placement within them.
pub fn usable(layout: &MigLayout) -> bool {
    layout.memory_slices <= MAX_MEMORY_SLICES
        && layout.profiles.iter().all(|p| {
            p.placements.iter().all(|&start| {
                span(MigPlacement {
                    start,
                    size: p.memory_slices,
                })
                .is_some_and(|m| m.leading_zeros() >= 8 - layout.memory_slices)
            })
        })
}

/// The free placements of `profile` when `occupied` slices are taken.
pub fn free_placements(
    profile: &MigProfile,
    occupied: Mask,
) -> impl Iterator<Item = MigPlacement> + '_ {
    profile
        .placements
        .iter()
        .map(|&start| MigPlacement {
            start,
            size: profile.memory_slices,
        })
        .filter(move |&p| span(p).is_some_and(|m| m & occupied == 0))
}

/// The profiles that serve `memory_mib` and `cores` percent of the SMs, in
/// the order the scheduler tries them: least memory, then least compute,
/// then NVML order. Media-extension profiles are left out.
pub fn fitting_profiles(
    layout: &MigLayout,
    memory_mib: u64,
    cores: u32,
) -> Vec<(usize, &MigProfile)> {
    let compute = layout.compute_slices.max(1);
    let mut fitting: Vec<(usize, &MigProfile)> = layout
        .profiles
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            !p.media
                && p.memory_mib >= memory_mib
                && u64::from(p.compute_slices) * 100 >= u64::from(cores) * u64::from(compute)
        })
        .collect();
    fitting.sort_by_key(|(i, p)| (p.memory_mib, p.compute_slices, *i));
    fitting
}

/// The instance the scheduler creates for a request: the first fitting
/// profile (see [`fitting_profiles`]) with a free placement, at the
/// placement that keeps the GPU least fragmented: the largest profile still
/// placeable afterwards is as large as possible, then as many placements as
/// possible stay free, then the lowest start. `None` when nothing fits.
pub fn choose(
    layout: &MigLayout,
    memory_mib: u64,
    cores: u32,
    occupied: Mask,
) -> Option<(usize, MigPlacement)> {
    fitting_profiles(layout, memory_mib, cores)
        .into_iter()
        .find_map(|(index, profile)| {
            let best = free_placements(profile, occupied).max_by_key(|&p| {
                let after = occupied | span(p).unwrap_or(0);
                let (largest, count) = room(layout, after);
                (largest, count, std::cmp::Reverse(p.start))
            })?;
            Some((index, best))
        })
}

/// The most memory slices any profile can still take, and the number of
/// free placements over all profiles, when `occupied` is taken.
fn room(layout: &MigLayout, occupied: Mask) -> (u32, usize) {
    let mut largest = 0;
    let mut count = 0;
    for profile in layout.profiles.iter().filter(|p| !p.media) {
        let free = free_placements(profile, occupied).count();
        if free > 0 {
            largest = largest.max(profile.memory_slices);
        }
        count += free;
    }
    (largest, count)
}

/// What is still free on a GPU, for a person: `2× 1g.10gb, 1× 2g.20gb`
/// (each profile's free placements, largest profile first), or `nothing`.
pub fn describe_free(layout: &MigLayout, occupied: Mask) -> String {
    let mut parts: Vec<(u64, String)> = layout
        .profiles
        .iter()
        .filter(|p| !p.media)
        .filter_map(|p| {
            let free = free_placements(p, occupied).count();
            (free > 0).then(|| (p.memory_mib, format!("{free}× {}", p.name)))
        })
        .collect();
    if parts.is_empty() {
        return "nothing".to_owned();
    }
    parts.sort_by_key(|(memory, _)| std::cmp::Reverse(*memory));
    parts
        .into_iter()
        .map(|(_, text)| text)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn a100() -> MigLayout {
        layout_for_model("NVIDIA A100-SXM4-80GB").unwrap()
    }

    fn profile<'a>(layout: &'a MigLayout, name: &str) -> &'a MigProfile {
        layout.profiles.iter().find(|p| p.name == name).unwrap()
    }

    #[test]
    fn known_models_have_usable_tables() {
        for model in [
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA H100 80GB HBM3",
        ] {
            let layout = layout_for_model(model).unwrap();
            assert!(usable(&layout), "{model}");
            assert_eq!(layout.profiles.len(), 7, "{model}");
        }
        assert_eq!(layout_for_model("Tesla T4"), None);
        let small = layout_for_model("NVIDIA A100-SXM4-40GB").unwrap();
        assert_eq!(profile(&small, "3g.20gb").memory_mib, 19968);
        assert_eq!(
            profile(&small, "3g.20gb").placements,
            profile(&a100(), "3g.40gb").placements
        );
        assert_eq!(resource_name("3g.20gb"), "nvidia.com/mig-3g.20gb");
        assert_eq!(resource_name("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
        assert_eq!(layout_for_model("NVIDIA H200"), None);
    }

    /// `make gpu-check`'s script compares a real GPU's profiles with a copy
    /// of these tables; the copy must not drift.
    #[test]
    fn the_gpu_check_script_has_the_same_tables() {
        let script = include_str!("../../interposer/gpu-check/modes.py");
        /// Name, NVML id, most instances, MiB.
        type Row = (String, u32, u32, u64);
        let mut tables: Vec<(String, Vec<Row>)> = Vec::new();
        let block = script
            .lines()
            .skip_while(|l| !l.starts_with("TABLES = {"))
            .skip(1)
            .take_while(|l| *l != "}");
        for line in block.map(str::trim) {
            if let Some(model) = line
                .strip_prefix("(\"")
                .and_then(|l| l.strip_suffix("\"): {"))
            {
                tables.push((model.replace("\", \"", " "), Vec::new()));
                continue;
            }
            for entry in line.split("), ").filter(|e| e.starts_with('"')) {
                let entry = entry.trim_end_matches([')', ',']);
                let (name, numbers) = entry.split_once("\": (").unwrap();
                let n: Vec<u64> = numbers.split(", ").map(|x| x.parse().unwrap()).collect();
                let row = (name[1..].to_owned(), n[0] as u32, n[1] as u32, n[2]);
                tables.last_mut().unwrap().1.push(row);
            }
        }
        let models = [
            ("A100 80GB", "NVIDIA A100-SXM4-80GB"),
            ("A100 40GB", "NVIDIA A100-SXM4-40GB"),
            ("H100 80GB", "NVIDIA H100 80GB HBM3"),
        ];
        assert_eq!(tables.len(), models.len(), "{tables:?}");
        for (key, model) in models {
            let rows = &tables.iter().find(|(k, _)| k == key).unwrap().1;
            let ours: Vec<Row> = layout_for_model(model)
                .unwrap()
                .profiles
                .into_iter()
                .map(|p| (p.name, p.id, p.max_instances, p.memory_mib))
                .collect();
            assert_eq!(rows, &ours, "{model}");
        }
    }

    #[test]
    fn spans_cover_their_slices_and_refuse_what_overflows() {
        assert_eq!(span(MigPlacement { start: 0, size: 8 }), Some(0xff));
        assert_eq!(span(MigPlacement { start: 4, size: 4 }), Some(0xf0));
        assert_eq!(span(MigPlacement { start: 6, size: 1 }), Some(0x40));
        assert_eq!(span(MigPlacement { start: 7, size: 2 }), None);
        assert_eq!(span(MigPlacement { start: 0, size: 0 }), None);
        assert_eq!(
            span(MigPlacement {
                start: u32::MAX,
                size: 2
            }),
            None
        );
    }

    #[test]
    fn the_smallest_profile_covering_the_request_is_chosen() {
        let layout = a100();
        let name = |memory, cores| {
            choose(&layout, memory, cores, 0).map(|(i, _)| layout.profiles[i].name.clone())
        };
        assert_eq!(name(1, 0).as_deref(), Some("1g.10gb"));
        assert_eq!(name(8000, 0).as_deref(), Some("1g.10gb"));
        assert_eq!(name(9728, 0).as_deref(), Some("1g.10gb"));
        assert_eq!(name(9729, 0).as_deref(), Some("1g.20gb"));
        assert_eq!(name(9000, 20).as_deref(), Some("2g.20gb"));
        assert_eq!(name(30_000, 0).as_deref(), Some("3g.40gb"));
        assert_eq!(name(30_000, 50).as_deref(), Some("4g.40gb"));
        assert_eq!(name(50_000, 0).as_deref(), Some("7g.80gb"));
        assert_eq!(name(1, 100).as_deref(), Some("7g.80gb"));
        assert_eq!(name(80_897, 0), None);
    }

    #[test]
    fn small_instances_go_where_they_leave_the_largest_room() {
        let layout = a100();
        // On an empty GPU a 1g goes to slice 6: 4g.40gb stays possible at 0.
        let (_, first) = choose(&layout, 1000, 0, 0).unwrap();
        assert_eq!(first, MigPlacement { start: 6, size: 1 });
        // 3g.40gb goes to 4 when 0..4 is taken, and nowhere when 4..8 is.
        let (_, at) = choose(&layout, 30_000, 0, 0x0f).unwrap();
        assert_eq!(at, MigPlacement { start: 4, size: 4 });
        let (_, at) = choose(&layout, 30_000, 0, 0x10).unwrap();
        assert_eq!(at, MigPlacement { start: 0, size: 4 });
        assert_eq!(choose(&layout, 30_000, 0, 0x11), None);
    }

    #[test]
    fn a_larger_profile_serves_when_the_smallest_has_no_room() {
        let layout = a100();
        // Slices 0-5 taken, 6 free, 7 free: 1g.10gb fits at 6.
        let (i, at) = choose(&layout, 1000, 0, 0x3f).unwrap();
        assert_eq!(
            (layout.profiles[i].name.as_str(), at),
            ("1g.10gb", MigPlacement { start: 6, size: 1 })
        );
        // Slices 0-6 taken: the 1g.10gb placements are gone; 1g.20gb at 6
        // needs slice 6 too, so nothing fits.
        assert_eq!(choose(&layout, 1000, 0, 0x7f), None);
    }

    #[test]
    fn free_capacity_reads_like_nvidia_smi() {
        let layout = a100();
        assert_eq!(describe_free(&layout, 0xff), "nothing");
        assert_eq!(describe_free(&layout, 0x3f), "1× 1g.20gb, 1× 1g.10gb");
        assert_eq!(
            describe_free(&layout, 0),
            "1× 7g.80gb, 2× 3g.40gb, 1× 4g.40gb, 4× 1g.20gb, 3× 2g.20gb, 7× 1g.10gb"
        );
        let p = profile(&layout, "2g.20gb");
        assert_eq!(free_placements(p, 0x0c).count(), 2);
    }

    proptest! {
        /// Whatever sequence of requests and releases, the instances chosen
        /// never share a memory slice, never start off their profile's
        /// placements, and never exceed the GPU's compute slices.
        #[test]
        fn chosen_instances_never_overlap(
            ops in proptest::collection::vec((0u64..90_000, 0u32..=100, any::<bool>(), 0usize..8), 1..80),
        ) {
            let layout = a100();
            let mut live: Vec<(usize, MigPlacement)> = Vec::new();
            for (memory, cores, release, pick) in ops {
                if release && !live.is_empty() {
                    live.remove(pick % live.len());
                    continue;
                }
                let occupied = occupied(live.iter().map(|(_, p)| *p));
                match choose(&layout, memory, cores, occupied) {
                    Some((index, placement)) => {
                        let profile = &layout.profiles[index];
                        prop_assert!(profile.memory_mib >= memory);
                        prop_assert!(profile.placements.contains(&placement.start));
                        prop_assert_eq!(placement.size, profile.memory_slices);
                        prop_assert_eq!(span(placement).unwrap() & occupied, 0);
                        live.push((index, placement));
                    }
                    None => {
                        // Nothing fitting is free: no fitting profile has a free placement.
                        for (_, p) in fitting_profiles(&layout, memory, cores) {
                            prop_assert_eq!(free_placements(p, occupied).count(), 0);
                        }
                    }
                }
                let compute: u32 = live.iter().map(|(i, _)| layout.profiles[*i].compute_slices).sum();
                prop_assert!(compute <= layout.compute_slices, "{live:?}");
                for (i, (_, a)) in live.iter().enumerate() {
                    for (_, b) in &live[i + 1..] {
                        prop_assert_eq!(span(*a).unwrap() & span(*b).unwrap(), 0);
                    }
                }
            }
        }
    }
}
