//! Pod-level placement options from annotations, and the bounds every list
//! annotation (GPU types and UUIDs, and each vendor's) is read within.
//!
//! A tenant writes these lists, and Filter checks every device of every
//! node against them, so their size is bounded where they are parsed: at most
//! [`MAX_LIST_ENTRIES`] entries of at most [`MAX_LIST_ENTRY_BYTES`] bytes, in
//! a value of at most [`MAX_LIST_BYTES`] bytes. A GPU model name is about 30
//! bytes (`NVIDIA H100 80GB HBM3`), a GPU UUID 40 (`GPU-` and 36), a vendor's
//! device id less than 64, and a node holds at most 16 devices, so 32 entries
//! of 128 bytes leave room for every real list (two full nodes by UUID) while
//! keeping Filter's per-device work under 32 short comparisons. The total
//! bound (twice 32 × 128, so spaces after commas never matter) covers what
//! the other two cannot see: blank entries (`,,,,`) and padding.
//! Type lists are lowercased here, once, and UUID lists are sets, so Filter
//! allocates nothing per node and looks a UUID up in O(log n).

use std::collections::{BTreeMap, BTreeSet};

use tessera_api::Violation;
use tessera_api::names::annotations as keys;
use tessera_api::v1alpha1::{OperatingMode, SchedulingPolicy};

use super::shown::{cut, shown};
use super::weights::{self, ScoringWeights};

/// Most entries a list annotation (`nvidia.com/use-gputype` and the other
/// type and UUID lists, a vendor's among them) may hold.
pub const MAX_LIST_ENTRIES: usize = 32;
/// Longest entry of a list annotation, in bytes (after trimming blanks).
pub const MAX_LIST_ENTRY_BYTES: usize = 128;
/// Longest value of a list annotation, in bytes, separators and blanks
/// included.
pub const MAX_LIST_BYTES: usize = 8 * 1024;

/// Placement options a pod sets through annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodOptions {
    /// Only GPUs whose model contains one of these (case-insensitive:
    /// lowercased at parse, at most [`MAX_LIST_ENTRIES`]); empty: any.
    pub use_gpu_types: Vec<String>,
    /// GPUs whose model contains one of these (case-insensitive: lowercased
    /// at parse, at most [`MAX_LIST_ENTRIES`]) are excluded.
    pub nouse_gpu_types: Vec<String>,
    /// Only these GPU UUIDs (at most [`MAX_LIST_ENTRIES`]); empty: any.
    pub use_gpu_uuids: BTreeSet<String>,
    /// These GPU UUIDs (at most [`MAX_LIST_ENTRIES`]) are excluded.
    pub nouse_gpu_uuids: BTreeSet<String>,
    /// All GPUs of a container must share one NUMA node.
    pub numa_bind: bool,
    /// The sharing mode the GPUs must run in; `None`: any.
    pub vgpu_mode: Option<OperatingMode>,
    /// GPU policy override; `None`: the cluster default.
    pub gpu_policy: Option<SchedulingPolicy>,
    /// `mutex` in `hami.io/gpu-scheduler-policy`: only idle GPUs, each then
    /// the pod's alone while it lives; `None` without the annotation (the
    /// cluster default decides, as HAMi's `--gpu-scheduler-policy` does).
    pub mutex: Option<bool>,
    /// How a GPU's slice, core and memory fractions weigh when the GPUs of
    /// a node are ordered (`hami.io/device-scoring-weights`).
    pub scoring_weights: ScoringWeights,
    /// Node policy override; `None`: the cluster default.
    pub node_policy: Option<SchedulingPolicy>,
}

/// Reads the options, recording a violation for every malformed annotation.
pub(super) fn parse(
    annotations: Option<&BTreeMap<String, String>>,
    violations: &mut Vec<Violation>,
) -> PodOptions {
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let use_gpu_types = types(annotations, keys::USE_GPU_TYPE, violations);
    let nouse_gpu_types = types(annotations, keys::NOUSE_GPU_TYPE, violations);
    let use_gpu_uuids = uuids(annotations, keys::USE_GPU_UUID, violations);
    let nouse_gpu_uuids = uuids(annotations, keys::NOUSE_GPU_UUID, violations);
    let mut violate = |field: &str, rule: String| {
        violations.push(Violation {
            container: None,
            field: field.to_owned(),
            rule,
        });
    };
    let (gpu_policy, mutex) = gpu_policy(get(keys::GPU_SCHEDULER_POLICY), &mut violate);
    let scoring_weights = match get(keys::DEVICE_SCORING_WEIGHTS).map(weights::parse) {
        None => ScoringWeights::default(),
        Some(Ok(weights)) => weights,
        Some(Err(rule)) => {
            violate(keys::DEVICE_SCORING_WEIGHTS, rule);
            ScoringWeights::default()
        }
    };
    let options = PodOptions {
        use_gpu_types,
        nouse_gpu_types,
        use_gpu_uuids,
        nouse_gpu_uuids,
        numa_bind: match get(keys::NUMA_BIND).map(str::to_ascii_lowercase).as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                violate(
                    keys::NUMA_BIND,
                    format!("must be \"true\" or \"false\", got {}", shown(other)),
                );
                false
            }
        },
        vgpu_mode: get(keys::VGPU_MODE).and_then(|value| {
            let mode = [
                OperatingMode::HamiCore,
                OperatingMode::Mig,
                OperatingMode::Mps,
            ]
            .into_iter()
            .find(|m| m.as_str() == value);
            if mode.is_none() {
                violate(
                    keys::VGPU_MODE,
                    format!("must be hami-core, mig or mps, got {}", shown(value)),
                );
            }
            mode
        }),
        gpu_policy,
        mutex,
        scoring_weights,
        node_policy: policy(
            get(keys::NODE_SCHEDULER_POLICY),
            keys::NODE_SCHEDULER_POLICY,
            &mut violate,
        ),
    };
    // Both sets are bounded; one lookup per listed UUID.
    for uuid in options.use_gpu_uuids.intersection(&options.nouse_gpu_uuids) {
        violate(
            keys::USE_GPU_UUID,
            format!(
                "lists {uuid:?}, which {} excludes; no GPU could satisfy both",
                keys::NOUSE_GPU_UUID
            ),
        );
    }
    options
}

/// The entries of the list annotation `key` (a comma list, blanks removed),
/// empty when it is absent. A value over the bounds is refused, naming the
/// annotation and the bound, and reads as empty.
fn list<'a>(
    annotations: Option<&'a BTreeMap<String, String>>,
    key: &str,
    violations: &mut Vec<Violation>,
) -> Vec<&'a str> {
    let Some(value) = annotations.and_then(|a| a.get(key)) else {
        return Vec::new();
    };
    match entries(value) {
        Ok(entries) => entries,
        Err(rule) => {
            violations.push(Violation {
                container: None,
                field: key.to_owned(),
                rule,
            });
            Vec::new()
        }
    }
}

/// A list value's entries, or the bound it breaks.
fn entries(value: &str) -> Result<Vec<&str>, String> {
    if value.len() > MAX_LIST_BYTES {
        return Err(format!(
            "is {} bytes long; a list may be at most {MAX_LIST_BYTES} bytes",
            value.len()
        ));
    }
    let entries: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if entries.len() > MAX_LIST_ENTRIES {
        return Err(format!(
            "lists {} entries; at most {MAX_LIST_ENTRIES} are allowed",
            entries.len()
        ));
    }
    if let Some(long) = entries.iter().find(|e| e.len() > MAX_LIST_ENTRY_BYTES) {
        return Err(format!(
            "entry {} is {} bytes long; an entry may be at most {MAX_LIST_ENTRY_BYTES} bytes",
            cut(long),
            long.len()
        ));
    }
    Ok(entries)
}

/// A type list annotation (matched case-insensitively as a substring of the
/// device's model), lowercased, within the bounds.
pub(super) fn types(
    annotations: Option<&BTreeMap<String, String>>,
    key: &str,
    violations: &mut Vec<Violation>,
) -> Vec<String> {
    list(annotations, key, violations)
        .into_iter()
        .map(str::to_lowercase)
        .collect()
}

/// A UUID list annotation (matched exactly) as a set, within the bounds.
pub(super) fn uuids(
    annotations: Option<&BTreeMap<String, String>>,
    key: &str,
    violations: &mut Vec<Violation>,
) -> BTreeSet<String> {
    list(annotations, key, violations)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The pod's GPU policy annotation: its order and whether it asks for
/// `mutex` (`None`, `None` without the annotation).
fn gpu_policy(
    value: Option<&str>,
    violate: &mut impl FnMut(&str, String),
) -> (Option<SchedulingPolicy>, Option<bool>) {
    let Some(value) = value else {
        return (None, None);
    };
    match parse_gpu_policy(value) {
        Ok((order, mutex)) => (order, Some(mutex)),
        Err(rule) => {
            violate(keys::GPU_SCHEDULER_POLICY, rule);
            (None, None)
        }
    }
}

/// A GPU policy (HAMi's policy chain): a comma list of at most one of
/// binpack and spread (the first written orders the GPUs; none: the
/// default) and `mutex` (a filter: idle GPUs only). Blank entries are
/// skipped; anything else is refused, naming it.
pub fn parse_gpu_policy(value: &str) -> Result<(Option<SchedulingPolicy>, bool), String> {
    let (mut order, mut mutex) = (None, false);
    for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match token.to_ascii_lowercase().as_str() {
            "binpack" => {
                order.get_or_insert(SchedulingPolicy::Binpack);
            }
            "spread" => {
                order.get_or_insert(SchedulingPolicy::Spread);
            }
            "mutex" => mutex = true,
            _ => {
                return Err(format!(
                    "must be a comma list of binpack, spread and mutex, got {} ({} is not one; Tessera does not take HAMi's numa and topology-aware here)",
                    shown(value),
                    shown(token)
                ));
            }
        }
    }
    if order.is_none() && !mutex {
        return Err(format!(
            "must be a comma list of binpack, spread and mutex, got {}",
            shown(value)
        ));
    }
    Ok((order, mutex))
}

fn policy(
    value: Option<&str>,
    key: &str,
    violate: &mut impl FnMut(&str, String),
) -> Option<SchedulingPolicy> {
    let value = value?;
    match value.trim().to_ascii_lowercase().as_str() {
        "binpack" => Some(SchedulingPolicy::Binpack),
        "spread" => Some(SchedulingPolicy::Spread),
        _ => {
            violate(
                key,
                format!("must be binpack or spread, got {}", shown(value)),
            );
            None
        }
    }
}
