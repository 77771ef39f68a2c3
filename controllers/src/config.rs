//! Cluster-wide settings of the controller, from a YAML file (`--config`).
//!
//! Every key is optional; docs/configuration.md lists them with defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_api::{names, v1alpha1::SchedulingPolicy};
use tessera_scheduling::request::RequestConfig;

use crate::Error;

/// The controller's cluster-wide settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Config {
    /// Resource names and request defaults (HAMi's `nvidia:` section).
    #[serde(flatten)]
    pub request: RequestConfig,
    /// GPU policy when a pod sets none (HAMi default: spread): `binpack`,
    /// `spread`, `mutex` or a comma list of them, as HAMi's
    /// `--gpu-scheduler-policy` takes.
    pub gpu_scheduler_policy: GpuPolicy,
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
    /// When Filter finds no room for a GPU pod, displace lower-priority GPU
    /// pods whose slices let it fit (device-aware preemption; docs/teams.md).
    pub device_preemption: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            request: RequestConfig::default(),
            gpu_scheduler_policy: GpuPolicy::default(),
            node_scheduler_policy: SchedulingPolicy::Binpack,
            scheduler_name: names::DEFAULT_SCHEDULER_NAME.to_owned(),
            node_lock_ttl_seconds: 60,
            node_lock_wait_millis: 20_000,
            allow_enforcement_env: false,
            device_preemption: true,
        }
    }
}

/// The cluster's GPU policy: how GPUs are ordered, and whether pods take
/// only idle GPUs (HAMi's `mutex`) unless they say otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GpuPolicy {
    /// binpack or spread (spread when the list names neither, as HAMi).
    pub order: SchedulingPolicy,
    /// Whether `mutex` is in the list.
    pub mutex: bool,
}

impl Default for GpuPolicy {
    fn default() -> Self {
        Self {
            order: SchedulingPolicy::Spread,
            mutex: false,
        }
    }
}

impl TryFrom<String> for GpuPolicy {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        let (order, mutex) = tessera_scheduling::request::parse_gpu_policy(&value)
            .map_err(|rule| format!("gpuSchedulerPolicy {rule}"))?;
        Ok(Self {
            order: order.unwrap_or(SchedulingPolicy::Spread),
            mutex,
        })
    }
}

impl From<GpuPolicy> for String {
    fn from(policy: GpuPolicy) -> Self {
        let order = policy.order.as_str();
        if policy.mutex {
            format!("{order},mutex")
        } else {
            order.to_owned()
        }
    }
}

impl Config {
    /// The pod's options with the cluster's defaults for what it left
    /// unsaid: the GPU order and `mutex`.
    pub fn gpu_policy_of(
        &self,
        options: &mut tessera_scheduling::request::PodOptions,
    ) -> SchedulingPolicy {
        options.mutex.get_or_insert(self.gpu_scheduler_policy.mutex);
        options
            .gpu_policy
            .unwrap_or(self.gpu_scheduler_policy.order)
    }

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
        assert_eq!(config.gpu_scheduler_policy.order, SchedulingPolicy::Binpack);
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

    #[test]
    fn the_gpu_policy_takes_hamis_chains_and_pods_override_it() {
        let mutex = Config::from_yaml("gpuSchedulerPolicy: \"binpack, mutex\"").unwrap();
        assert_eq!(
            mutex.gpu_scheduler_policy,
            GpuPolicy {
                order: SchedulingPolicy::Binpack,
                mutex: true
            }
        );
        let alone = Config::from_yaml("gpuSchedulerPolicy: mutex").unwrap();
        assert_eq!(alone.gpu_scheduler_policy.order, SchedulingPolicy::Spread);
        assert_eq!(
            serde_yaml_ng::to_string(&mutex.gpu_scheduler_policy)
                .unwrap()
                .trim(),
            "binpack,mutex"
        );
        let err = Config::from_yaml("gpuSchedulerPolicy: numa")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "gpuSchedulerPolicy must be a comma list of binpack, spread and mutex, got \"numa\""
            ),
            "{err}"
        );

        // A pod without the annotation takes the default; one with it, its own.
        let mut unsaid = tessera_scheduling::request::PodOptions::default();
        assert_eq!(mutex.gpu_policy_of(&mut unsaid), SchedulingPolicy::Binpack);
        assert_eq!(unsaid.mutex, Some(true));
        let mut spread = tessera_scheduling::request::PodOptions {
            gpu_policy: Some(SchedulingPolicy::Spread),
            mutex: Some(false),
            ..Default::default()
        };
        assert_eq!(mutex.gpu_policy_of(&mut spread), SchedulingPolicy::Spread);
        assert_eq!(spread.mutex, Some(false));
    }
}
