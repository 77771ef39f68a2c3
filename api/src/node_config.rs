//! Which [`GpuNodeConfig`]s select a node, and the settings that result.
//!
//! Pure logic shared by the node agent (its effective settings) and the
//! controller (each config's matched nodes and conflicts).
//!
//! A config selects a node when the node's labels match `nodeSelector` (if
//! set) and its name matches one of `nodeNames` (if set). Settings resolve per
//! key: the cluster default, overridden by matching configs in ascending
//! `priority`. Among configs of equal priority that set one key to different
//! values, the one whose name sorts first wins and the clash is a
//! [`ConfigConflict`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::v1alpha1::{ConfigConflict, GpuNodeConfig, GpuNodeConfigSpec, NodeSettings};

/// A node's settings and where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// The effective settings.
    pub settings: NodeSettings,
    /// Names of the configs that select the node, lowest precedence first.
    pub applied: Vec<String>,
    /// Keys that equal-priority configs set to different values.
    pub conflicts: Vec<ConfigConflict>,
    /// The config whose `cordonDevices` the settings hold, if any.
    pub cordoned_by: Option<String>,
}

impl GpuNodeConfig {
    /// Whether this config selects the node with this name and these labels.
    pub fn selects(&self, node: &str, labels: &BTreeMap<String, String>) -> bool {
        let by_labels = self
            .spec
            .node_selector
            .as_ref()
            .is_none_or(|s| selector_matches(s, labels));
        let by_name = self.spec.node_names.is_empty()
            || self.spec.node_names.iter().any(|p| glob_matches(p, node));
        let selects_something =
            self.spec.node_selector.is_some() || !self.spec.node_names.is_empty();
        selects_something && by_labels && by_name
    }

    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

/// Resolves a node's settings from the cluster defaults and every config.
pub fn resolve(
    node: &str,
    labels: &BTreeMap<String, String>,
    defaults: &NodeSettings,
    configs: &[GpuNodeConfig],
) -> Resolved {
    // Highest precedence first: priority descending, then name ascending.
    let mut ordered: Vec<&GpuNodeConfig> =
        configs.iter().filter(|c| c.selects(node, labels)).collect();
    ordered.sort_by(|a, b| {
        b.spec
            .priority
            .cmp(&a.spec.priority)
            .then_with(|| a.name().cmp(b.name()))
    });

    let mut p = Picker {
        node,
        ordered: &ordered,
        conflicts: Vec::new(),
    };
    let d = defaults;
    let settings = NodeSettings {
        device_split_count: p
            .get("deviceSplitCount", |s| s.device_split_count)
            .unwrap_or(d.device_split_count),
        device_memory_scaling: p
            .get("deviceMemoryScaling", |s| s.device_memory_scaling)
            .unwrap_or(d.device_memory_scaling),
        device_core_scaling: p
            .get("deviceCoreScaling", |s| s.device_core_scaling)
            .unwrap_or(d.device_core_scaling),
        operating_mode: p
            .get("operatingMode", |s| s.operating_mode)
            .unwrap_or(d.operating_mode),
        mig_strategy: p
            .get("migStrategy", |s| s.mig_strategy)
            .unwrap_or(d.mig_strategy),
        mig_profiles: p
            .get("migProfiles", |s| s.mig_profiles.clone())
            .unwrap_or_else(|| d.mig_profiles.clone()),
        filter_devices: p
            .get("filterDevices", |s| s.filter_devices.clone())
            .unwrap_or_else(|| d.filter_devices.clone()),
        cordon_devices: p
            .get("cordonDevices", |s| s.cordon_devices.clone())
            .unwrap_or_else(|| d.cordon_devices.clone()),
        front_door: p.get("frontDoor", |s| s.front_door).unwrap_or(d.front_door),
        lib_cuda_log_level: p
            .get("libCudaLogLevel", |s| s.lib_cuda_log_level)
            .unwrap_or(d.lib_cuda_log_level),
        gpu_core_policy: p
            .get("gpuCorePolicy", |s| s.gpu_core_policy)
            .unwrap_or(d.gpu_core_policy),
    };
    let cordoned_by = ordered
        .iter()
        .find(|c| c.spec.cordon_devices.is_some())
        .map(|c| c.name().to_owned());
    Resolved {
        settings,
        applied: ordered.iter().rev().map(|c| c.name().to_owned()).collect(),
        conflicts: p.conflicts,
        cordoned_by,
    }
}

struct Picker<'a> {
    node: &'a str,
    ordered: &'a [&'a GpuNodeConfig],
    conflicts: Vec<ConfigConflict>,
}

impl Picker<'_> {
    /// The value of the highest-precedence config that sets `field`, noting
    /// equal-priority configs that disagree.
    fn get<T: PartialEq>(
        &mut self,
        field: &str,
        read: impl Fn(&GpuNodeConfigSpec) -> Option<T>,
    ) -> Option<T> {
        let mut setters = self
            .ordered
            .iter()
            .filter_map(|c| read(&c.spec).map(|v| (*c, v)));
        let (winner, value) = setters.next()?;
        let rivals: Vec<String> = setters
            .filter(|(c, v)| c.spec.priority == winner.spec.priority && *v != value)
            .map(|(c, _)| c.name().to_owned())
            .collect();
        if !rivals.is_empty() {
            let mut configs = vec![winner.name().to_owned()];
            configs.extend(rivals);
            self.conflicts.push(ConfigConflict {
                node: self.node.to_owned(),
                field: field.to_owned(),
                configs,
            });
        }
        Some(value)
    }
}

/// Whether `name` matches a glob where `*` is any run of characters and `?` one character.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                backtrack = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match backtrack {
                // Let the last `*` swallow one more character and retry.
                Some((star, matched)) => {
                    pi = star + 1;
                    ni = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether labels match a Kubernetes label selector (`{}` matches everything).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let listed = || e.values.iter().flatten().any(|v| Some(v) == value);
        match e.operator.as_str() {
            "In" => listed(),
            "NotIn" => !listed(),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // The API server does not restrict operators inside CRDs; an
            // unknown one selects nothing rather than everything.
            _ => false,
        }
    });
    by_labels && by_expressions
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;
    use crate::v1alpha1::{CorePolicy, OperatingMode};

    fn config(name: &str, spec: serde_json::Value) -> GpuNodeConfig {
        serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn globs() {
        let cases = [
            ("inference-pool-*", "inference-pool-7", true),
            ("inference-pool-*", "inference-pool-", true),
            ("inference-pool-*", "training-pool-1", false),
            ("node-?", "node-a", true),
            ("node-?", "node-ab", false),
            ("*-gpu-*", "rack1-gpu-3", true),
            ("*a*b", "xaxxb", true),
            ("*a*b", "xaxxbc", false),
            ("exact", "exact", true),
            ("exact", "exact2", false),
            ("*", "", true),
            ("", "", true),
            ("a**b", "ab", true),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(glob_matches(pattern, name), want, "{pattern} vs {name}");
        }
    }

    #[test]
    fn selection_by_labels_names_or_both() {
        let gpu = labels(&[("gpu", "a100"), ("zone", "z1")]);
        let by_label = config(
            "l",
            json!({"nodeSelector": {"matchLabels": {"gpu": "a100"}}}),
        );
        let by_name = config("n", json!({"nodeNames": ["pool-*"]}));
        let both = config(
            "b",
            json!({"nodeSelector": {"matchLabels": {"gpu": "a100"}}, "nodeNames": ["pool-*"]}),
        );
        let all = config("all", json!({"nodeSelector": {}}));
        let exprs = config(
            "e",
            json!({"nodeSelector": {"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["z1", "z2"]},
                {"key": "spot", "operator": "DoesNotExist"},
            ]}}),
        );
        let bogus = config(
            "x",
            json!({"nodeSelector": {"matchExpressions": [{"key": "zone", "operator": "Like"}]}}),
        );
        assert!(by_label.selects("other", &gpu));
        assert!(!by_label.selects("other", &labels(&[])));
        assert!(by_name.selects("pool-1", &labels(&[])));
        assert!(!by_name.selects("other", &gpu));
        assert!(both.selects("pool-1", &gpu));
        assert!(!both.selects("other", &gpu), "both must match");
        assert!(!both.selects("pool-1", &labels(&[])), "both must match");
        assert!(all.selects("anything", &labels(&[])));
        assert!(exprs.selects("n", &gpu));
        assert!(!exprs.selects("n", &labels(&[("zone", "z1"), ("spot", "true")])));
        assert!(!bogus.selects("n", &gpu));
        assert!(
            !config("none", json!({})).selects("n", &gpu),
            "a config without selectors selects nothing"
        );
    }

    #[test]
    fn settings_resolve_by_priority_then_name_with_conflicts_reported() {
        let configs = [
            config(
                "base",
                json!({"nodeSelector": {}, "deviceSplitCount": 4, "gpuCorePolicy": "force"}),
            ),
            config(
                "pool",
                json!({"nodeNames": ["pool-*"], "priority": 10, "deviceSplitCount": 8, "operatingMode": "mps"}),
            ),
            config(
                "a-team",
                json!({"nodeNames": ["pool-1"], "priority": 10, "deviceSplitCount": 2, "deviceMemoryScaling": 1.5}),
            ),
            config(
                "agree",
                json!({"nodeNames": ["pool-1"], "priority": 10, "operatingMode": "mps"}),
            ),
            config(
                "elsewhere",
                json!({"nodeNames": ["other"], "priority": 99, "deviceSplitCount": 1}),
            ),
        ];
        let got = resolve("pool-1", &labels(&[]), &NodeSettings::default(), &configs);
        assert_eq!(
            got.settings.device_split_count, 2,
            "a-team sorts before pool at priority 10"
        );
        assert_eq!(got.settings.device_memory_scaling, 1.5);
        assert_eq!(got.settings.device_core_scaling, 1.0, "the default");
        assert_eq!(got.settings.operating_mode, OperatingMode::Mps);
        assert_eq!(
            got.settings.gpu_core_policy,
            CorePolicy::Force,
            "from the low-priority base"
        );
        assert_eq!(got.applied, ["base", "pool", "agree", "a-team"]);
        assert_eq!(
            got.conflicts,
            [ConfigConflict {
                node: "pool-1".into(),
                field: "deviceSplitCount".into(),
                configs: vec!["a-team".into(), "pool".into()],
            }],
            "agree sets the same mode as pool, which is no conflict; base has lower priority"
        );

        let untouched = resolve(
            "lonely",
            &labels(&[]),
            &NodeSettings::default(),
            &configs[1..],
        );
        assert_eq!(untouched.settings, NodeSettings::default());
        assert!(untouched.applied.is_empty() && untouched.conflicts.is_empty());
    }

    #[test]
    fn the_cordon_of_the_highest_precedence_config_holds_and_names_it() {
        let configs = [
            config(
                "fleet",
                json!({"nodeSelector": {}, "cordonDevices": {"indexes": [0]}}),
            ),
            config(
                "repair",
                json!({"nodeNames": ["gpu-7"], "priority": 5, "cordonDevices": {"uuids": ["GPU-bad"]}}),
            ),
        ];
        let got = resolve("gpu-7", &labels(&[]), &NodeSettings::default(), &configs);
        assert_eq!(got.settings.cordon_devices.uuids, ["GPU-bad"]);
        assert!(got.settings.cordon_devices.indexes.is_empty());
        assert_eq!(got.cordoned_by.as_deref(), Some("repair"));
        assert!(got.settings.cordon_devices.picks("GPU-bad", 3));
        assert!(!got.settings.cordon_devices.picks("GPU-ok", 0));

        let fleet = resolve("gpu-1", &labels(&[]), &NodeSettings::default(), &configs);
        assert!(fleet.settings.cordon_devices.picks("GPU-any", 0));
        assert_eq!(fleet.cordoned_by.as_deref(), Some("fleet"));

        let none = resolve("gpu-1", &labels(&[]), &NodeSettings::default(), &[]);
        assert!(none.settings.cordon_devices.is_empty() && none.cordoned_by.is_none());
    }
}
