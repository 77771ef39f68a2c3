//! Pod-level placement options from annotations.

use std::collections::BTreeMap;

use crate::Violation;
use crate::names::annotations as keys;
use crate::v1alpha1::{OperatingMode, SchedulingPolicy};

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
        gpu_policy: policy(
            get(keys::GPU_SCHEDULER_POLICY),
            keys::GPU_SCHEDULER_POLICY,
            &mut violate,
        ),
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
