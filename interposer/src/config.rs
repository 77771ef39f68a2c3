//! The interposer's configuration, read once from the node agent's limits
//! file and the environment (`limits.rs`) with the strict parsers of
//! `tessera_api::env`.

use std::ffi::OsString;
use std::path::PathBuf;

use tessera_api::env::{
    self, CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE, CUDA_DEVICE_SM_LIMIT,
    CUDA_DISABLE_CONTROL, CUDA_TASK_PRIORITY, CoreUtilizationPolicy, GPU_CORE_UTILIZATION_POLICY,
    LIBCUDA_LOG_LEVEL,
};
use tessera_vgpu_region::{MAX_DEVICES, Priority};

pub mod limits;

/// Where the region lives when `CUDA_DEVICE_MEMORY_SHARED_CACHE` is unset. The
/// node agent always sets the variable; this default only serves processes
/// started by hand, which then share one region per machine (per `/tmp`).
pub const DEFAULT_REGION_PATH: &str = "/tmp/tessera-vgpu.region";

/// Everything that can go wrong while configuring the interposer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A variable of the environment contract has a malformed value.
    #[error(transparent)]
    Env(#[from] tessera_api::Error),
    /// A variable is not valid UTF-8.
    #[error("{name} is not valid UTF-8")]
    NotUnicode {
        /// The variable.
        name: String,
    },
    /// The shared region cannot be used.
    #[error(transparent)]
    Region(#[from] tessera_vgpu_region::Error),
    /// The node agent's limits file exists but cannot be read.
    #[error("cannot read the node agent's limits file {path}: {why}")]
    LimitsFile {
        /// Its path.
        path: String,
        /// Why.
        why: String,
    },
    /// The node agent's region directory is in the container but its
    /// limits file is not: something hid the file (the agent mounts both).
    #[error(
        "the node agent's region directory {region_dir} is here but its limits file {path} is missing: the agent always mounts both, so the file was hidden (a volume of the pod's own mounted over its directory?); refusing CUDA rather than taking the limits from the environment"
    )]
    LimitsMissing {
        /// The limits file.
        path: String,
        /// The region directory.
        region_dir: String,
    },
    /// The environment sets a limit variable other than the node agent's
    /// limits file does.
    #[error(
        "{name}={env:?} in the environment, but the node agent's limits file {} {}: a container's limits come from the file",
        tessera_api::env::LIMITS_FILE,
        file.as_ref().map_or_else(|| "does not set it".to_owned(), |f| format!("says {f:?}"))
    )]
    Overridden {
        /// The variable.
        name: String,
        /// Its value in the environment.
        env: String,
        /// Its value in the file, if the file sets it.
        file: Option<String>,
    },
}

/// The interposer's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `CUDA_DISABLE_CONTROL=true`: every hook passes straight through.
    pub disabled: bool,
    /// Memory limit per CUDA ordinal in bytes, 0 for none.
    pub limits: [u64; MAX_DEVICES],
    /// Compute limit per CUDA ordinal, percent of the device's time (1 to
    /// 99), 0 for none: `CUDA_DEVICE_SM_LIMIT`, overridden for ordinal `i` by
    /// `CUDA_DEVICE_SM_LIMIT_<i>` (0 and 100 mean no limit, as in HAMi).
    pub sm_limits: [u8; MAX_DEVICES],
    /// `GPU_CORE_UTILIZATION_POLICY`: when the compute limit applies.
    pub core_policy: CoreUtilizationPolicy,
    /// `CUDA_TASK_PRIORITY`: 0 high, 1 (the default) low.
    pub priority: Priority,
    /// The shared region file.
    pub region_path: PathBuf,
    /// `LIBCUDA_LOG_LEVEL`, 0 to 4.
    pub log_level: u8,
}

impl Config {
    /// Reads the configuration through `var` (the process environment in
    /// production, a map in tests).
    ///
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>` overrides `CUDA_DEVICE_MEMORY_LIMIT` and
    /// `CUDA_DEVICE_SM_LIMIT_<i>` overrides `CUDA_DEVICE_SM_LIMIT` for
    /// ordinal `i`. A malformed value of any variable is an error, never "no
    /// limit"; a malformed log level is the one exception (it falls back to 2
    /// and the caller warns).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<OsString>,
    ) -> Result<(Self, Option<Error>), Error> {
        let text = |name: &str| -> Result<Option<String>, Error> {
            var(name)
                .map(|v| {
                    v.into_string().map_err(|_| Error::NotUnicode {
                        name: name.to_owned(),
                    })
                })
                .transpose()
        };
        let disabled = match text(CUDA_DISABLE_CONTROL)? {
            Some(v) => env::parse_switch(CUDA_DISABLE_CONTROL, &v)?,
            None => false,
        };
        let default_limit = match text(CUDA_DEVICE_MEMORY_LIMIT)? {
            Some(v) => env::parse_memory_limit(CUDA_DEVICE_MEMORY_LIMIT, &v)?,
            None => 0,
        };
        let mut limits = [default_limit; MAX_DEVICES];
        for (index, limit) in limits.iter_mut().enumerate() {
            let name = env::memory_limit_var(index);
            if let Some(v) = text(&name)? {
                *limit = env::parse_memory_limit(&name, &v)?;
            }
        }
        let default_sm = match text(CUDA_DEVICE_SM_LIMIT)? {
            Some(v) => env::parse_sm_limit(&v)?.unwrap_or(0),
            None => 0,
        };
        let mut sm_limits = [default_sm; MAX_DEVICES];
        for (index, limit) in sm_limits.iter_mut().enumerate() {
            let name = sm_limit_var(index);
            if let Some(v) = text(&name)? {
                *limit = parse_device_sm_limit(&name, &v)?;
            }
        }
        let core_policy = match text(GPU_CORE_UTILIZATION_POLICY)? {
            Some(v) => CoreUtilizationPolicy::parse(&v)?,
            None => CoreUtilizationPolicy::Default,
        };
        let priority = match text(CUDA_TASK_PRIORITY)? {
            Some(v) => parse_priority(&v)?,
            None => Priority::Low,
        };
        let region_path = var(CUDA_DEVICE_MEMORY_SHARED_CACHE)
            .map_or_else(|| PathBuf::from(DEFAULT_REGION_PATH), PathBuf::from);
        let (log_level, warning) = match text(LIBCUDA_LOG_LEVEL)?.map(|v| env::parse_log_level(&v))
        {
            None => (crate::log::WARN, None),
            Some(Ok(level)) => (level, None),
            Some(Err(e)) => (crate::log::WARN, Some(e.into())),
        };
        Ok((
            Self {
                disabled,
                limits,
                sm_limits,
                core_policy,
                priority,
                region_path,
                log_level,
            },
            warning,
        ))
    }

    /// Whether any device has a memory limit.
    pub fn any_limit(&self) -> bool {
        self.limits.iter().any(|&l| l != 0)
    }

    /// Whether any device has a compute limit.
    pub fn any_sm_limit(&self) -> bool {
        self.sm_limits.iter().any(|&l| l != 0)
    }

    /// The limits to create the shared region with.
    pub fn region_limits(&self) -> tessera_vgpu_region::Limits {
        tessera_vgpu_region::Limits {
            memory: self.limits,
            sm_percent: self.sm_limits,
            priority: self.priority,
        }
    }
}

/// The per-device compute limit variable, `CUDA_DEVICE_SM_LIMIT_<index>`.
pub fn sm_limit_var(index: usize) -> String {
    format!("{CUDA_DEVICE_SM_LIMIT}_{index}")
}

/// Parses `CUDA_TASK_PRIORITY`: `0` (high) or `1` (low), HAMi's values.
fn parse_priority(value: &str) -> Result<Priority, Error> {
    match value {
        "0" => Ok(Priority::High),
        "1" => Ok(Priority::Low),
        _ => Err(tessera_api::Error::InvalidEnv {
            name: CUDA_TASK_PRIORITY.to_owned(),
            value: value.to_owned(),
            rule: "must be 0 (high priority) or 1 (low priority, the default)",
        }
        .into()),
    }
}

/// Parses `CUDA_DEVICE_SM_LIMIT_<i>` with `CUDA_DEVICE_SM_LIMIT`'s rule
/// (a whole percentage, 0 and 100 meaning no limit), naming `name` when it
/// is malformed. 0 for no limit.
fn parse_device_sm_limit(name: &str, value: &str) -> Result<u8, Error> {
    env::parse_sm_limit(value)
        .map(|p| p.unwrap_or(0))
        .map_err(|e| match e {
            tessera_api::Error::InvalidEnv { value, rule, .. } => tessera_api::Error::InvalidEnv {
                name: name.to_owned(),
                value,
                rule,
            }
            .into(),
            other => other.into(),
        })
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<(Config, Option<Error>), Error> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        Config::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn per_device_limits_override_the_default() {
        let (config, warning) = read(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "3000m"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/r/x.cache"),
            ("LIBCUDA_LOG_LEVEL", "4"),
        ])
        .unwrap();
        assert!(warning.is_none());
        assert_eq!(config.limits[0], 4 << 30);
        assert_eq!(config.limits[1], 3000 << 20);
        assert_eq!(config.limits[15], 4 << 30);
        assert_eq!(config.region_path, PathBuf::from("/r/x.cache"));
        assert_eq!(config.log_level, 4);
        assert!(!config.disabled && config.any_limit());
    }

    #[test]
    fn nothing_set_means_no_limits_and_the_default_region() {
        let (config, _) = read(&[]).unwrap();
        assert_eq!(config.limits, [0; MAX_DEVICES]);
        assert!(!config.any_limit());
        assert_eq!(config.region_path, PathBuf::from(DEFAULT_REGION_PATH));
        assert_eq!(config.log_level, 2);
    }

    #[test]
    fn malformed_values_are_errors_never_no_limit() {
        for vars in [
            &[("CUDA_DEVICE_MEMORY_LIMIT", "1.5g")][..],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_3", "0"),
            ][..],
            &[("CUDA_DISABLE_CONTROL", "maybe")][..],
        ] {
            let err = read(vars).unwrap_err().to_string();
            let name = vars.last().unwrap().0;
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn compute_limit_and_policy() {
        let (config, _) = read(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "FORCE"),
        ])
        .unwrap();
        assert_eq!(config.sm_limits, [30; MAX_DEVICES]);
        assert_eq!(config.core_policy, CoreUtilizationPolicy::Force);
        assert_eq!(config.region_limits().sm_percent, [30; MAX_DEVICES]);
        for no_limit in ["0", "100"] {
            let (config, _) = read(&[("CUDA_DEVICE_SM_LIMIT", no_limit)]).unwrap();
            assert!(!config.any_sm_limit());
            assert_eq!(config.core_policy, CoreUtilizationPolicy::Default);
        }
        for (name, value) in [
            ("CUDA_DEVICE_SM_LIMIT", "101"),
            ("CUDA_DEVICE_SM_LIMIT", "30%"),
            ("GPU_CORE_UTILIZATION_POLICY", "sometimes"),
        ] {
            let err = read(&[(name, value)]).unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn per_device_compute_limits_override_the_default() {
        let (config, _) = read(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_SM_LIMIT_1", "60"),
            // 0 and 100 mean no limit on that device, whatever the default.
            ("CUDA_DEVICE_SM_LIMIT_2", "0"),
            ("CUDA_DEVICE_SM_LIMIT_3", "100"),
        ])
        .unwrap();
        assert_eq!(config.sm_limits[..5], [30, 60, 0, 0, 30]);
        assert_eq!(config.sm_limits[15], 30);
        // A per-device limit alone limits only its device.
        let (config, _) = read(&[("CUDA_DEVICE_SM_LIMIT_15", "25")]).unwrap();
        let mut expected = [0; MAX_DEVICES];
        expected[15] = 25;
        assert_eq!(config.sm_limits, expected);
        assert!(config.any_sm_limit() && !config.any_limit());
    }

    #[test]
    fn the_task_priority_is_0_or_1() {
        assert_eq!(read(&[]).unwrap().0.priority, Priority::Low);
        let (config, _) = read(&[("CUDA_TASK_PRIORITY", "0")]).unwrap();
        assert_eq!(config.priority, Priority::High);
        assert_eq!(config.region_limits().priority, Priority::High);
        let (config, _) = read(&[("CUDA_TASK_PRIORITY", "1")]).unwrap();
        assert_eq!(config.priority, Priority::Low);
        for value in ["2", "-1", "high", "", " 0", "00"] {
            let err = read(&[("CUDA_TASK_PRIORITY", value)])
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!(
                    "CUDA_TASK_PRIORITY={value:?}: must be 0 (high priority) or 1 (low priority, the default)"
                )
            );
        }
    }

    #[test]
    fn a_malformed_per_device_compute_limit_names_its_variable() {
        for value in ["101", "-1", "2x", "", " 30", "1.5", "0x10"] {
            let err = read(&[
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("CUDA_DEVICE_SM_LIMIT_7", value),
            ])
            .unwrap_err()
            .to_string();
            assert_eq!(
                err,
                format!("CUDA_DEVICE_SM_LIMIT_7={value:?}: must be a whole number from 0 to 100"),
            );
        }
    }

    #[test]
    fn a_bad_log_level_only_warns() {
        let (config, warning) =
            read(&[("LIBCUDA_LOG_LEVEL", "9"), ("CUDA_DISABLE_CONTROL", "true")]).unwrap();
        assert_eq!(config.log_level, 2);
        assert!(config.disabled);
        assert!(warning.unwrap().to_string().contains("LIBCUDA_LOG_LEVEL"));
    }
}
