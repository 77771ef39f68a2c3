//! The environment contract between the node agent, which writes these
//! variables into a container at `Allocate`, and the interposer, which reads
//! them inside the container. Names and value formats are HAMi-core's, so an
//! image built for HAMi works unchanged.
//!
//! This module has no dependencies: the interposer uses it without pulling in
//! Kubernetes. Every parser is strict: a malformed value is an error naming the
//! variable and the rule, never a silent "no limit".

use crate::Error;

/// Default memory limit for every visible device, e.g. `4096m`.
pub const CUDA_DEVICE_MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// Percent of SM time the container may use on each device (0 or 100: no limit).
pub const CUDA_DEVICE_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// Path of the container's shared accounting region.
pub const CUDA_DEVICE_MEMORY_SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// `default`, `force` or `disable`: when the compute limit applies.
pub const GPU_CORE_UTILIZATION_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// `true` turns all enforcement off for the container.
pub const CUDA_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";
/// Interposer log level, 0 (errors only) to 4 (debug).
pub const LIBCUDA_LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// Task priority for the compute limiter: 0 high, 1 low.
pub const CUDA_TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
/// `true` when device memory is oversubscribed (memory scaling above 1).
pub const CUDA_OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
/// Comma list of the GPU UUIDs visible to the container.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// MPS: the directory of the control daemon's pipes (the client finds the
/// GPU's MPS server there).
pub const CUDA_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// MPS: the control daemon's log directory.
pub const CUDA_MPS_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
/// MPS: percent of the GPU's SMs the client's contexts may use.
pub const CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// MPS: device memory the client may pin, per device: `0=8000M`.
pub const CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// Whether the node agent sets `name` to enforce a container's slice: the
/// limits, the shared region, the policy and priority, the enforcement
/// switch, the visible devices and the MPS client's settings. A pod that sets one of these itself would
/// override the agent's value (the kubelet puts the container's own `env`
/// after the device plugin's), so the webhook refuses it.
pub fn is_enforcement_var(name: &str) -> bool {
    const EXACT: [&str; 12] = [
        CUDA_DEVICE_MEMORY_LIMIT,
        CUDA_DEVICE_SM_LIMIT,
        CUDA_DEVICE_MEMORY_SHARED_CACHE,
        GPU_CORE_UTILIZATION_POLICY,
        CUDA_DISABLE_CONTROL,
        CUDA_TASK_PRIORITY,
        CUDA_OVERSUBSCRIBE,
        NVIDIA_VISIBLE_DEVICES,
        CUDA_MPS_PIPE_DIRECTORY,
        CUDA_MPS_LOG_DIRECTORY,
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
    ];
    EXACT.contains(&name)
        || [CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_SM_LIMIT]
            .iter()
            .any(|prefix| {
                name.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix('_'))
                    .is_some_and(|index| !index.is_empty())
            })
}

/// The directory in a container where the node agent mounts, read-only, the
/// file holding the container's limits ([`LIMITS_FILE`]).
pub const LIMITS_DIR: &str = "/var/run/tessera/limits";
/// The container's limits as the node agent wrote them: one `NAME=VALUE`
/// line per [limit variable](is_limit_var) it set. The interposer takes
/// these variables from the file when it exists; the environment may repeat
/// them (HAMi's images read it) but must agree, or CUDA is refused.
pub const LIMITS_FILE: &str = "/var/run/tessera/limits/limits.env";
/// [`LIMITS_FILE`]'s name in [`LIMITS_DIR`] (on the host, in the
/// container's limits directory).
pub const LIMITS_FILE_NAME: &str = "limits.env";
/// Longest limits file read (a container's limits take a few hundred bytes).
pub const MAX_LIMITS_FILE: usize = 16 * 1024;

/// Whether the interposer takes `name` from the [limits file](LIMITS_FILE)
/// when there is one: the enforcement variables it reads (the limits, the
/// region, the policy, the switch, the priority, oversubscription).
pub fn is_limit_var(name: &str) -> bool {
    is_enforcement_var(name)
        && ![
            NVIDIA_VISIBLE_DEVICES,
            CUDA_MPS_PIPE_DIRECTORY,
            CUDA_MPS_LOG_DIRECTORY,
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
            CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
        ]
        .contains(&name)
}

/// The limits file for the limit variables among `vars` (others are left
/// out), one sorted `NAME=VALUE` line each.
pub fn format_limits_file<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut lines: Vec<String> = vars
        .into_iter()
        .filter(|(name, _)| is_limit_var(name))
        .map(|(name, value)| format!("{name}={value}\n"))
        .collect();
    lines.sort();
    lines.concat()
}

/// Parses a limits file: `NAME=VALUE` lines of limit variables, each at
/// most once, values without control characters, the whole at most
/// [`MAX_LIMITS_FILE`] bytes.
pub fn parse_limits_file(text: &str) -> Result<Vec<(String, String)>, Error> {
    let invalid = |line: usize, rule: String| Error::InvalidLimitsFile { line, rule };
    if text.len() > MAX_LIMITS_FILE {
        return Err(invalid(
            0,
            format!(
                "{} bytes, more than the {MAX_LIMITS_FILE} a limits file may have",
                text.len()
            ),
        ));
    }
    let mut vars: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.is_empty() {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(invalid(n, "is not NAME=VALUE".into()));
        };
        if !is_limit_var(name) {
            return Err(invalid(
                n,
                format!("{name:?} is not a variable the limits file may set"),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(invalid(
                n,
                format!("the value of {name} has a control character"),
            ));
        }
        if vars.iter().any(|(seen, _)| seen == name) {
            return Err(invalid(n, format!("{name} is set twice")));
        }
        vars.push((name.to_owned(), value.to_owned()));
    }
    Ok(vars)
}

/// Highest device index that may carry its own memory limit variable.
pub const MAX_DEVICES: usize = 16;

/// The per-device memory limit variable, `CUDA_DEVICE_MEMORY_LIMIT_<index>`.
pub fn memory_limit_var(index: usize) -> String {
    format!("{CUDA_DEVICE_MEMORY_LIMIT}_{index}")
}

/// Formats a memory limit the way the node agent writes it: `<MiB>m`.
pub fn format_memory_limit(mib: u64) -> String {
    format!("{mib}m")
}

/// Parses a memory limit into bytes.
///
/// Accepts decimal digits with an optional unit suffix `k`, `m` or `g`
/// (either case; KiB, MiB, GiB). Without a suffix the value is bytes. Zero,
/// signs, fractions, hexadecimal, whitespace and overflow are errors.
pub fn parse_memory_limit(name: &str, value: &str) -> Result<u64, Error> {
    let invalid = |rule: &'static str| Error::invalid_env(name, value, rule);
    let (digits, shift) = match value.as_bytes().last() {
        Some(b'k' | b'K') => (&value[..value.len() - 1], 10),
        Some(b'm' | b'M') => (&value[..value.len() - 1], 20),
        Some(b'g' | b'G') => (&value[..value.len() - 1], 30),
        _ => (value, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            "must be a whole number with an optional k, m or g suffix, e.g. 4096m",
        ));
    }
    let number: u64 = digits
        .parse()
        .map_err(|_| invalid("is too large to represent in bytes"))?;
    let bytes = number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| invalid("is too large to represent in bytes"))?;
    if bytes == 0 {
        return Err(invalid(
            "must be greater than zero; unset the variable for no limit",
        ));
    }
    Ok(bytes)
}

/// Parses `CUDA_DEVICE_SM_LIMIT`: a whole percentage from 0 to 100.
///
/// Returns `None` when the value means "no limit" (0 or 100, as in HAMi-core).
pub fn parse_sm_limit(value: &str) -> Result<Option<u8>, Error> {
    let percent = parse_small_int(
        CUDA_DEVICE_SM_LIMIT,
        value,
        100,
        "must be a whole number from 0 to 100",
    )?;
    Ok(match percent {
        0 | 100 => None,
        p => Some(p),
    })
}

/// Parses `LIBCUDA_LOG_LEVEL`: 0 to 4.
pub fn parse_log_level(value: &str) -> Result<u8, Error> {
    parse_small_int(
        LIBCUDA_LOG_LEVEL,
        value,
        4,
        "must be a whole number from 0 (errors) to 4 (debug)",
    )
}

/// Parses a boolean switch such as `CUDA_DISABLE_CONTROL`: `true`/`1` or `false`/`0`.
pub fn parse_switch(name: &str, value: &str) -> Result<bool, Error> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(Error::invalid_env(
            name,
            value,
            "must be true, false, 1 or 0",
        )),
    }
}

/// When the compute limit applies, from `GPU_CORE_UTILIZATION_POLICY`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CoreUtilizationPolicy {
    /// HAMi's default: the limit applies while the GPU is shared with another container.
    #[default]
    Default,
    /// The limit always applies.
    Force,
    /// The limit never applies.
    Disable,
}

impl CoreUtilizationPolicy {
    /// The value as written in the environment.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Force => "force",
            Self::Disable => "disable",
        }
    }

    /// Parses the environment value (case-insensitive).
    pub fn parse(value: &str) -> Result<Self, Error> {
        match value.to_ascii_lowercase().as_str() {
            "default" => Ok(Self::Default),
            "force" => Ok(Self::Force),
            "disable" => Ok(Self::Disable),
            _ => Err(Error::invalid_env(
                GPU_CORE_UTILIZATION_POLICY,
                value,
                "must be default, force or disable",
            )),
        }
    }
}

fn parse_small_int(name: &str, value: &str, max: u8, rule: &'static str) -> Result<u8, Error> {
    if value.is_empty() || value.len() > 3 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::invalid_env(name, value, rule));
    }
    match value.parse::<u8>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(Error::invalid_env(name, value, rule)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits_parse_with_units() {
        let cases = [
            ("1", 1),
            ("4096", 4096),
            ("1k", 1024),
            ("3000m", 3000 << 20),
            ("3000M", 3000 << 20),
            ("2g", 2 << 30),
            ("2G", 2 << 30),
        ];
        for (input, bytes) in cases {
            assert_eq!(parse_memory_limit("V", input).unwrap(), bytes, "{input}");
        }
    }

    #[test]
    fn memory_limits_reject_everything_else() {
        for input in [
            "",
            "m",
            "0",
            "0m",
            "-1m",
            "1.5g",
            "0x10",
            " 10m",
            "10m ",
            "10mb",
            "10t",
            "99999999999999999999",
            "17179869184g",
        ] {
            let err = parse_memory_limit("CUDA_DEVICE_MEMORY_LIMIT_0", input)
                .unwrap_err()
                .to_string();
            assert!(err.contains("CUDA_DEVICE_MEMORY_LIMIT_0"), "{input}: {err}");
        }
    }

    #[test]
    fn memory_limit_round_trips_the_agent_format() {
        for mib in [1, 3000, 81920] {
            assert_eq!(
                parse_memory_limit("V", &format_memory_limit(mib)).unwrap(),
                mib << 20
            );
        }
        assert_eq!(memory_limit_var(3), "CUDA_DEVICE_MEMORY_LIMIT_3");
    }

    #[test]
    fn sm_limit_treats_zero_and_hundred_as_unlimited() {
        assert_eq!(parse_sm_limit("0").unwrap(), None);
        assert_eq!(parse_sm_limit("100").unwrap(), None);
        assert_eq!(parse_sm_limit("30").unwrap(), Some(30));
        for bad in ["101", "-1", "30%", "", "1000", "abc"] {
            let err = parse_sm_limit(bad).unwrap_err().to_string();
            assert!(
                err.contains(CUDA_DEVICE_SM_LIMIT) && err.contains("0 to 100"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn switches_policies_and_log_levels() {
        assert!(parse_switch(CUDA_DISABLE_CONTROL, "TRUE").unwrap());
        assert!(!parse_switch(CUDA_DISABLE_CONTROL, "0").unwrap());
        assert!(parse_switch(CUDA_DISABLE_CONTROL, "yes").is_err());
    }

    #[test]
    fn the_limits_file_is_its_name_in_its_directory() {
        assert_eq!(LIMITS_FILE, format!("{LIMITS_DIR}/{LIMITS_FILE_NAME}"));
    }

    #[test]
    fn a_limits_file_round_trips_and_refuses_what_is_not_a_limit() {
        let text = format_limits_file([
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m"),
            ("LIBCUDA_LOG_LEVEL", "2"),
            ("NVIDIA_VISIBLE_DEVICES", "GPU-1"),
        ]);
        assert_eq!(
            text,
            "CUDA_DEVICE_MEMORY_LIMIT_0=4096m\nCUDA_DEVICE_SM_LIMIT=30\n"
        );
        assert_eq!(
            parse_limits_file(&text).unwrap(),
            [
                ("CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(), "4096m".to_owned()),
                ("CUDA_DEVICE_SM_LIMIT".to_owned(), "30".to_owned()),
            ]
        );
        assert!(parse_limits_file("").unwrap().is_empty());
        for (bad, rule) in [
            ("CUDA_DEVICE_SM_LIMIT", "line 1: is not NAME=VALUE"),
            (
                "LIBCUDA_LOG_LEVEL=4",
                "line 1: \"LIBCUDA_LOG_LEVEL\" is not",
            ),
            (
                "CUDA_DEVICE_SM_LIMIT=30\nCUDA_DEVICE_SM_LIMIT=90",
                "line 2: CUDA_DEVICE_SM_LIMIT is set twice",
            ),
            ("CUDA_DEVICE_SM_LIMIT=3\r0", "control character"),
        ] {
            let error = parse_limits_file(bad).unwrap_err().to_string();
            assert!(error.contains(rule), "{bad:?}: {error}");
        }
        let long = "CUDA_DEVICE_SM_LIMIT=".to_owned() + &"9".repeat(MAX_LIMITS_FILE);
        assert!(
            parse_limits_file(&long)
                .unwrap_err()
                .to_string()
                .contains("more than")
        );
    }

    #[test]
    fn enforcement_variables_are_the_agents_and_only_those() {
        for name in [
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT_0",
            "CUDA_DEVICE_MEMORY_LIMIT_15",
            "CUDA_DEVICE_MEMORY_LIMIT_x",
            "CUDA_DEVICE_SM_LIMIT",
            "CUDA_DEVICE_SM_LIMIT_3",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "GPU_CORE_UTILIZATION_POLICY",
            "CUDA_DISABLE_CONTROL",
            "CUDA_TASK_PRIORITY",
            "CUDA_OVERSUBSCRIBE",
            "NVIDIA_VISIBLE_DEVICES",
            "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        ] {
            assert!(is_enforcement_var(name), "{name}");
        }
        for name in [
            "LIBCUDA_LOG_LEVEL",
            "CUDA_VISIBLE_DEVICES",
            "CUDA_DEVICE_MEMORY_LIMIT_",
            "CUDA_DEVICE_MEMORY_LIMITS",
            "CUDA_MPS_PIPE_DIRECTORY_0",
            "cuda_device_memory_limit",
            "PATH",
        ] {
            assert!(!is_enforcement_var(name), "{name}");
        }
        assert_eq!(
            CoreUtilizationPolicy::parse("Force").unwrap(),
            CoreUtilizationPolicy::Force
        );
        assert!(
            CoreUtilizationPolicy::parse("sometimes")
                .unwrap_err()
                .to_string()
                .contains(GPU_CORE_UTILIZATION_POLICY)
        );
        assert_eq!(parse_log_level("4").unwrap(), 4);
        assert!(parse_log_level("5").is_err());
    }
}
