//! The namespaces' ResourceQuotas, as far as they limit device resources:
//! every `limits.<name>` key whose name is a device memory or core resource
//! of a family Tessera schedules (HAMi's rule). Other keys are the kube
//! quota controller's business and are ignored here.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity};
use kube::ResourceExt;
use tessera_scheduling::request::{LIMITS_PREFIX, RequestConfig};

use crate::engine::quota::{Limit, Limits};

/// One quota's hard values of `limits.` keys, by resource name, as written.
type Hard = BTreeMap<String, String>;

/// Every namespace's quotas: namespace → quota name → its `limits.` keys.
#[derive(Debug, Default)]
pub struct QuotaTable {
    namespaces: HashMap<String, BTreeMap<String, Hard>>,
}

impl QuotaTable {
    /// Records a quota (replacing what it said before); whether its
    /// `limits.` keys changed (a status update changes none).
    pub fn record(&mut self, quota: &ResourceQuota) -> bool {
        let namespace = quota.namespace().unwrap_or_default();
        let hard: Hard = limits_keys(quota)
            .map(|(name, value)| (name.to_owned(), value.0.clone()))
            .collect();
        let quotas = self.namespaces.entry(namespace.clone()).or_default();
        let before = if hard.is_empty() {
            quotas.remove(&quota.name_any())
        } else {
            quotas.insert(quota.name_any(), hard.clone())
        };
        if quotas.is_empty() {
            self.namespaces.remove(&namespace);
        }
        before.unwrap_or_default() != hard
    }

    /// Forgets a deleted quota; whether it had `limits.` keys.
    pub fn forget(&mut self, quota: &ResourceQuota) -> bool {
        let namespace = quota.namespace().unwrap_or_default();
        let Some(quotas) = self.namespaces.get_mut(&namespace) else {
            return false;
        };
        let had = quotas.remove(&quota.name_any()).is_some();
        if quotas.is_empty() {
            self.namespaces.remove(&namespace);
        }
        had
    }

    /// Replaces everything after a relist.
    pub fn replace<'a>(&mut self, quotas: impl IntoIterator<Item = &'a ResourceQuota>) {
        self.namespaces.clear();
        for quota in quotas {
            let _ = self.record(quota);
        }
    }

    /// The device limits of `namespace` under `config`: per resource, the
    /// tightest of its quotas. A value that is not a whole number of units
    /// (`1.5`, `-1`, `100m`) limits nothing and is reported in the log.
    pub fn limits(&self, namespace: &str, config: &RequestConfig) -> Limits {
        let mut limits = Limits::new();
        for (quota, hard) in self.namespaces.get(namespace).into_iter().flatten() {
            for (name, value) in hard {
                let Some(resource) = config.quota_resource(name) else {
                    continue;
                };
                let hard = match tessera_api::quantity::whole(value) {
                    Ok(hard) => hard,
                    Err(rule) => {
                        tracing::warn!(
                            %namespace, %quota, key = %format!("{LIMITS_PREFIX}{name}"), %rule,
                            "a device quota must be a whole number of units; this one limits nothing"
                        );
                        continue;
                    }
                };
                let limit = Limit {
                    quota: quota.clone(),
                    hard,
                    unit: resource.unit(),
                };
                match limits.get(name) {
                    Some(tighter) if tighter.in_charge_units() <= limit.in_charge_units() => {}
                    _ => {
                        limits.insert(name.clone(), limit);
                    }
                }
            }
        }
        limits
    }

    /// Every namespace with a quota on some device resource.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.keys().map(String::as_str)
    }
}

/// A quota's `limits.` keys: the resource name after the prefix, and the
/// value as written.
pub fn limits_keys(quota: &ResourceQuota) -> impl Iterator<Item = (&str, &Quantity)> {
    quota
        .spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| Some((key.strip_prefix(LIMITS_PREFIX)?, value)))
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use tessera_scheduling::request::vendor_config;

    use super::*;

    fn quota(namespace: &str, name: &str, hard: &[(&str, &str)]) -> ResourceQuota {
        let mut quota = ResourceQuota::default();
        quota.metadata.name = Some(name.into());
        quota.metadata.namespace = Some(namespace.into());
        quota.spec = Some(k8s_openapi::api::core::v1::ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            ),
            ..Default::default()
        });
        quota
    }

    #[test]
    fn the_tightest_limits_key_of_a_device_resource_counts() {
        let config = vendor_config();
        let mut table = QuotaTable::default();
        table.record(&quota(
            "ml",
            "team",
            &[
                ("limits.nvidia.com/gpumem", "16000"),
                ("limits.nvidia.com/gpucores", "200"),
                ("requests.nvidia.com/gpumem", "1"),
                ("limits.nvidia.com/gpu", "4"),
                ("limits.cpu", "8"),
                ("limits.mthreads.com/sgpu-memory", "8"),
            ],
        ));
        table.record(&quota(
            "ml",
            "tighter",
            &[("limits.nvidia.com/gpumem", "8k")],
        ));
        table.record(&quota("other", "x", &[("limits.nvidia.com/gpumem", "1")]));
        let limits = table.limits("ml", &config);
        let summary: Vec<(&str, &str, u64, u64)> = limits
            .iter()
            .map(|(k, l)| (k.as_str(), l.quota.as_str(), l.hard, l.unit))
            .collect();
        assert_eq!(
            summary,
            [
                ("mthreads.com/sgpu-memory", "team", 8, 512),
                ("nvidia.com/gpucores", "team", 200, 1),
                ("nvidia.com/gpumem", "tighter", 8000, 1),
            ]
        );
        assert!(table.limits("nowhere", &config).is_empty());

        assert!(
            !table.record(&quota(
                "ml",
                "tighter",
                &[("limits.nvidia.com/gpumem", "8k")]
            )),
            "the same limits again (a status update) change nothing"
        );
        assert!(table.forget(&quota("ml", "tighter", &[])));
        assert_eq!(table.limits("ml", &config)["nvidia.com/gpumem"].hard, 16000);
        table.record(&quota("ml", "team", &[("limits.cpu", "8")]));
        assert!(table.limits("ml", &config).is_empty(), "no device key left");
        table.forget(&quota("ml", "team", &[]));
        assert_eq!(table.namespaces().collect::<Vec<_>>(), ["other"]);
    }

    #[test]
    fn an_explicit_zero_limits_and_a_malformed_value_does_not() {
        let config = vendor_config();
        let mut table = QuotaTable::default();
        table.record(&quota(
            "ml",
            "q",
            &[
                ("limits.nvidia.com/gpumem", "0"),
                ("limits.nvidia.com/gpucores", "1.5"),
            ],
        ));
        let limits = table.limits("ml", &config);
        assert_eq!(limits["nvidia.com/gpumem"].hard, 0);
        assert!(!limits.contains_key("nvidia.com/gpucores"));
    }
}
