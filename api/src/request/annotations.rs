//! Pod-level placement options from annotations.

use std::collections::BTreeMap;

use crate::Violation;
use crate::names::annotations as keys;
use crate::v1alpha1::{OperatingMode, SchedulingPolicy};

use super::weights::{self, ScoringWeights};

/// Placement options a pod sets through annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodOptions {
    /// Only GPUs whose model contains one of these (case-insensitive); empty: any.
    pub use_gpu_types: Vec<String>,
    /// GPUs whose model contains one of these (case-insensitive) are excluded.
    pub nouse_gpu_types: Vec<String>,
    /// Only these GPU UUIDs; empty: any.
    pub use_gpu_uuids: Vec<String>,
    /// These GPU UUIDs are excluded.
    pub nouse_gpu_uuids: Vec<String>,
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
        use_gpu_types: list(get(keys::USE_GPU_TYPE)),
        nouse_gpu_types: list(get(keys::NOUSE_GPU_TYPE)),
        use_gpu_uuids: list(get(keys::USE_GPU_UUID)),
        nouse_gpu_uuids: list(get(keys::NOUSE_GPU_UUID)),
        numa_bind: match get(keys::NUMA_BIND).map(str::to_ascii_lowercase).as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                violate(
                    keys::NUMA_BIND,
                    format!("must be \"true\" or \"false\", got {other:?}"),
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
                    format!("must be hami-core, mig or mps, got {value:?}"),
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
    for uuid in &options.use_gpu_uuids {
        if options.nouse_gpu_uuids.contains(uuid) {
            violate(
                keys::USE_GPU_UUID,
                format!(
                    "lists {uuid:?}, which {} excludes; no GPU could satisfy both",
                    keys::NOUSE_GPU_UUID
                ),
            );
        }
    }
    options
}

/// A comma list with blanks removed.
pub(super) fn list(value: Option<&str>) -> Vec<String> {
    value
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
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
                    "must be a comma list of binpack, spread and mutex, got {value:?} ({token:?} is not one; Tessera does not take HAMi's numa and topology-aware here)"
                ));
            }
        }
    }
    if order.is_none() && !mutex {
        return Err(format!(
            "must be a comma list of binpack, spread and mutex, got {value:?}"
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
            violate(key, format!("must be binpack or spread, got {value:?}"));
            None
        }
    }
}
