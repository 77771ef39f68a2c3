//! Cluster-wide settings of the controller, from a YAML file (`--config`).
//!
//! Every key is optional; docs/configuration.md lists them with defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_api::{names, request::RequestConfig, v1alpha1::SchedulingPolicy};

use crate::Error;

/// The controller's cluster-wide settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Config {
    /// Resource names and request defaults (HAMi's `nvidia:` section).
    #[serde(flatten)]
    pub request: RequestConfig,
    /// GPU policy when a pod sets none (HAMi default: spread).
    pub gpu_scheduler_policy: SchedulingPolicy,
    /// Node policy when a pod sets none (HAMi default: binpack).
    pub node_scheduler_policy: SchedulingPolicy,
    /// The scheduler name the webhook gives GPU pods.
    pub scheduler_name: String,
    /// How long a NodeLock lives unless released, in seconds (1-300).
    pub node_lock_ttl_seconds: u32,
    /// How long Bind waits for another pod's NodeLock before giving up, in milliseconds.
    pub node_lock_wait_millis: u64,
    /// Let GPU pods set the variables the node agent enforces their slice
    /// with (`CUDA_DEVICE_MEMORY_LIMIT…`, `CUDA_DISABLE_CONTROL`, …) in their
    /// containers' `env`, overriding the agent's values. Off: such a pod is
    /// refused at admission, since it could lift its own limits.
    pub allow_enforcement_env: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            request: RequestConfig::default(),
            gpu_scheduler_policy: SchedulingPolicy::Spread,
            node_scheduler_policy: SchedulingPolicy::Binpack,
            scheduler_name: names::DEFAULT_SCHEDULER_NAME.to_owned(),
            node_lock_ttl_seconds: 60,
            node_lock_wait_millis: 20_000,
            allow_enforcement_env: false,
        }
    }
}

impl Config {
    /// Parses and validates a YAML configuration.
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        let config: Self =
            serde_yaml_ng::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting, naming the first one that is wrong.
    pub fn validate(&self) -> Result<(), Error> {
        self.request
            .validate()
            .map_err(|e| Error::Config(e.to_string()))?;
        if !(1..=tessera_api::v1alpha1::MAX_LOCK_TTL_SECONDS).contains(&self.node_lock_ttl_seconds)
        {
            return Err(Error::Config(
                "config nodeLockTtlSeconds: must be between 1 and 300".into(),
            ));
        }
        if self.scheduler_name.is_empty() {
            return Err(Error::Config(
                "config schedulerName: must not be empty".into(),
            ));
        }
        Ok(())
    }

    /// [`Self::node_lock_wait_millis`] as a duration.
    pub fn node_lock_wait(&self) -> Duration {
        Duration::from_millis(self.node_lock_wait_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_overrides_defaults_and_rejects_nonsense() {
        let config = Config::from_yaml(
            "defaultMemory: 4096\ngpuSchedulerPolicy: binpack\nnodeLockTtlSeconds: 30\n",
        )
        .unwrap();
        assert_eq!(config.request.default_memory, 4096);
        assert_eq!(config.gpu_scheduler_policy, SchedulingPolicy::Binpack);
        assert_eq!(config.node_scheduler_policy, SchedulingPolicy::Binpack);
        assert_eq!(config.node_lock_ttl_seconds, 30);
        for (yaml, needle) in [
            ("nodeLockTtlSeconds: 0", "nodeLockTtlSeconds"),
            ("defaultGPUNum: 0", "defaultGPUNum"),
            ("gpuSchedulerPolicy: random", "gpuSchedulerPolicy"),
            ("nodeLockTTL: 5", "nodeLockTTL"),
        ] {
            let err = Config::from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(needle), "{yaml}: {err}");
        }
    }
}
