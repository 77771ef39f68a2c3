//! Fault and latency injection, for tests of how the interposer behaves
//! when the driver fails or is slow.
//!
//! | variable | format | effect |
//! |---|---|---|
//! | `FAKE_CUDA_FAIL` | `<function>:<code>[:<after>[:<times>]]`, comma-separated | the calls of `<function>` after the first `<after>` (default 0) return `<code>` without doing anything, `<times>` of them (default: all) |
//! | `FAKE_CUDA_LATENCY_US` | `<function>:<microseconds>`, comma-separated | every call of `<function>` sleeps that long before it runs |
//!
//! Calls are counted per process, from the first call of the function. Only
//! the functions in [`INJECTABLE`] have an injection point; naming another,
//! or any malformed entry, prints the variable and the rule and exits the
//! process with status 2 (a test must not run without the fault it asked
//! for). Unset or empty: one load per call.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::base::{CUDA_ERROR_UNKNOWN, CUresult};

/// The functions with an injection point.
pub(crate) const INJECTABLE: &[&str] = &[
    "cuInit",
    "cuCtxCreate_v2",
    "cuCtxGetDevice",
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemAllocPitch_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemCreate",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuEventRecord",
    "cuEventQuery",
];

/// A fault: calls `after..after + times` of `function` fail with `code`.
#[derive(Debug)]
struct Fault {
    function: String,
    code: CUresult,
    after: u64,
    times: Option<u64>,
    calls: AtomicU64,
}

impl PartialEq for Fault {
    fn eq(&self, other: &Self) -> bool {
        (&self.function, self.code, self.after, self.times)
            == (&other.function, other.code, other.after, other.times)
    }
}

/// What to inject, read once from the environment.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    faults: Vec<Fault>,
    /// (function, delay).
    latencies: Vec<(String, Duration)>,
}

static PLAN: OnceLock<Plan> = OnceLock::new();

fn plan() -> &'static Plan {
    PLAN.get_or_init(|| {
        let read = |name: &str| std::env::var(name).unwrap_or_default();
        match Plan::parse(&read("FAKE_CUDA_FAIL"), &read("FAKE_CUDA_LATENCY_US")) {
            Ok(plan) => plan,
            Err(message) => {
                eprintln!("fake libcuda: {message}");
                std::process::exit(2);
            }
        }
    })
}

impl Plan {
    fn parse(fail: &str, latency: &str) -> Result<Self, String> {
        let function = |var: &str, entry: &str, name: &str| -> Result<String, String> {
            if INJECTABLE.contains(&name) {
                Ok(name.to_owned())
            } else {
                Err(format!(
                    "{var}={entry:?}: {name:?} has no injection point; one of {}",
                    INJECTABLE.join(", ")
                ))
            }
        };
        let mut plan = Self::default();
        for entry in fail.split(',').filter(|e| !e.is_empty()) {
            let rule = "must be <function>:<error code>[:<after N calls>[:<times>]]";
            let bad = || format!("FAKE_CUDA_FAIL={entry:?}: {rule}");
            let parts: Vec<&str> = entry.split(':').collect();
            if !(2..=4).contains(&parts.len()) {
                return Err(bad());
            }
            let number = |i: usize| -> Result<Option<u64>, String> {
                parts
                    .get(i)
                    .map(|p| p.parse().map_err(|_| bad()))
                    .transpose()
            };
            let code = parts[1].parse::<CUresult>().map_err(|_| bad())?;
            if code == 0 {
                return Err(format!(
                    "FAKE_CUDA_FAIL={entry:?}: the error code must not be 0"
                ));
            }
            plan.faults.push(Fault {
                function: function("FAKE_CUDA_FAIL", entry, parts[0])?,
                code,
                after: number(2)?.unwrap_or(0),
                times: number(3)?,
                calls: AtomicU64::new(0),
            });
        }
        for entry in latency.split(',').filter(|e| !e.is_empty()) {
            let bad =
                || format!("FAKE_CUDA_LATENCY_US={entry:?}: must be <function>:<microseconds>");
            let (name, us) = entry.split_once(':').ok_or_else(bad)?;
            let us: u64 = us.parse().map_err(|_| bad())?;
            plan.latencies.push((
                function("FAKE_CUDA_LATENCY_US", entry, name)?,
                Duration::from_micros(us),
            ));
        }
        Ok(plan)
    }

    /// Runs the injection point of `function`: sleeps its latency, and
    /// returns the error of a fault that hits this call.
    fn at(&self, function: &str) -> Option<CUresult> {
        for (name, delay) in &self.latencies {
            if name == function {
                std::thread::sleep(*delay);
            }
        }
        let mut failed = None;
        for fault in self.faults.iter().filter(|f| f.function == function) {
            let call = fault.calls.fetch_add(1, Ordering::Relaxed);
            let hit = call >= fault.after && fault.times.is_none_or(|t| call - fault.after < t);
            if hit && failed.is_none() {
                failed = Some(fault.code);
            }
        }
        failed
    }
}

/// The injection point of `function` (one of [`INJECTABLE`]): sleeps its
/// latency, and returns the error code of a fault that hits this call.
/// Runs under `catch_unwind` (some callers are exports outside
/// [`crate::base::guard`]): a panic answers `CUDA_ERROR_UNKNOWN`.
#[inline]
pub(crate) fn point(function: &'static str) -> Option<CUresult> {
    debug_assert!(INJECTABLE.contains(&function), "{function}");
    std::panic::catch_unwind(|| {
        let plan = plan();
        if plan.faults.is_empty() && plan.latencies.is_empty() {
            return None;
        }
        plan.at(function)
    })
    .unwrap_or(Some(CUDA_ERROR_UNKNOWN))
}

/// [`crate::base::guard`] behind the injection point of `function`.
pub(crate) fn guard(
    function: &'static str,
    body: impl FnOnce() -> Result<(), CUresult>,
) -> CUresult {
    point(function).unwrap_or_else(|| crate::base::guard(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_hit_the_calls_after_the_first_n_for_a_number_of_times() {
        let plan = Plan::parse("cuMemAlloc_v2:2:3:2,cuMemCreate:999", "").unwrap();
        let hits: Vec<Option<CUresult>> = (0..7).map(|_| plan.at("cuMemAlloc_v2")).collect();
        assert_eq!(
            hits,
            [None, None, None, Some(2), Some(2), None, None],
            "calls 4 and 5 fail"
        );
        assert!((0..5).all(|_| plan.at("cuMemCreate") == Some(999)));
        assert_eq!(plan.at("cuMemFree_v2"), None);
    }

    #[test]
    fn latency_delays_every_call() {
        let plan = Plan::parse("", "cuLaunchKernel:2000").unwrap();
        let start = std::time::Instant::now();
        assert_eq!(plan.at("cuLaunchKernel"), None);
        assert!(start.elapsed() >= Duration::from_millis(2));
        assert_eq!(plan.latencies.len(), 1);
    }

    #[test]
    fn malformed_entries_name_the_variable_and_the_rule() {
        for (fail, latency, expected) in [
            (
                "cuMemAlloc_v2",
                "",
                "FAKE_CUDA_FAIL=\"cuMemAlloc_v2\": must be",
            ),
            ("cuMemAlloc_v2:x", "", "FAKE_CUDA_FAIL"),
            ("cuMemAlloc_v2:2:1:1:1", "", "FAKE_CUDA_FAIL"),
            ("cuMemAlloc_v2:0", "", "must not be 0"),
            ("cuNope:2", "", "has no injection point"),
            (
                "",
                "cuMemAlloc_v2",
                "FAKE_CUDA_LATENCY_US=\"cuMemAlloc_v2\": must be",
            ),
            ("", "cuMemAlloc_v2:-1", "FAKE_CUDA_LATENCY_US"),
        ] {
            let err = Plan::parse(fail, latency).unwrap_err();
            assert!(err.contains(expected), "{fail} {latency}: {err}");
        }
        assert_eq!(Plan::parse("", "").unwrap(), Plan::default());
    }
}
