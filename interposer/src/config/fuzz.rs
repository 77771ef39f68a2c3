//! Fuzz/property target for the interposer's environment (see
//! docs/fuzzing.md): any set of variables, with any values (non-UTF-8
//! included), gives either the configuration a model of the contract
//! predicts or an error naming the first malformed variable in read order.

use std::{collections::BTreeMap, ffi::OsString, os::unix::ffi::OsStringExt, time::Instant};

use proptest::{
    prelude::*,
    test_runner::{Config as RunnerConfig, TestCaseError, TestRunner},
};
use tessera_api::env;

use super::*;

/// Every variable `from_vars` reads, in the order it reads them, then two
/// it must ignore.
fn names() -> Vec<String> {
    let mut names = vec![
        CUDA_DISABLE_CONTROL.to_owned(),
        CUDA_DEVICE_MEMORY_LIMIT.to_owned(),
    ];
    names.extend((0..MAX_DEVICES).map(env::memory_limit_var));
    names.push(CUDA_DEVICE_SM_LIMIT.to_owned());
    names.extend((0..MAX_DEVICES).map(sm_limit_var));
    names.extend(
        [
            GPU_CORE_UTILIZATION_POLICY,
            CUDA_TASK_PRIORITY,
            CUDA_DEVICE_MEMORY_SHARED_CACHE,
            LIBCUDA_LOG_LEVEL,
        ]
        .map(str::to_owned),
    );
    names.push(env::memory_limit_var(MAX_DEVICES));
    names.push(sm_limit_var(MAX_DEVICES));
    names
}

fn value() -> impl Strategy<Value = OsString> {
    let text = prop_oneof![
        3 => proptest::sample::select(
            &["0", "1", "2", "4", "30", "99", "100", "101", "true", "FALSE", "force", "Disable", "default",
              "4096m", "3000M", "2g", "1k", "0m", "17179869184g", "/r/region", ""][..],
        )
        .prop_map(str::to_owned),
        2 => "[0-9]{0,22}[kKmMgGx%]?",
        1 => "\\PC{0,10}",
        1 => any::<String>(),
    ]
    .prop_map(OsString::from);
    let bytes = proptest::collection::vec(any::<u8>(), 0..12).prop_map(OsString::from_vec);
    prop_oneof![6 => text, 1 => bytes]
}

fn vars() -> impl Strategy<Value = BTreeMap<String, OsString>> {
    let names = names();
    let count = names.len();
    proptest::collection::btree_map(
        (0..count).prop_map(move |i| names[i].clone()),
        value(),
        0..8,
    )
}

/// What reading `name` gives under the contract: `Err(())` when malformed.
enum Read<T> {
    Unset,
    Set(T),
    Bad,
}

fn read<T>(
    vars: &BTreeMap<String, OsString>,
    name: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Read<T> {
    match vars.get(name).map(|v| v.to_str()) {
        None => Read::Unset,
        Some(None) => Read::Bad,
        Some(Some(text)) => parse(text).map_or(Read::Bad, Read::Set),
    }
}

/// A runner of `PROPTEST_CASES` cases (2,000 unless set), without
/// persisted failures.
fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

#[test]
fn fuzz_interposer_env() {
    let started = Instant::now();
    let mut runner = runner();
    let outcome = runner.run(&vars(), |vars| {
        let result = Config::from_vars(|name| vars.get(name).cloned());
        let input: usize = vars.iter().map(|(k, v)| k.len() + v.len()).sum();

        // The model: walk the variables in read order; the first malformed
        // one is the error.
        let memory = |v: &str| env::parse_memory_limit("V", v).ok();
        let sm = |v: &str| env::parse_sm_limit(v).ok().map(|p| p.unwrap_or(0));
        let mut first_bad: Option<String> = None;
        let mut note = |name: &str, bad: bool| {
            if bad && first_bad.is_none() {
                first_bad = Some(name.to_owned());
            }
        };
        let disabled = read(&vars, CUDA_DISABLE_CONTROL, |v| {
            env::parse_switch("V", v).ok()
        });
        note(CUDA_DISABLE_CONTROL, matches!(disabled, Read::Bad));
        let default_limit = read(&vars, CUDA_DEVICE_MEMORY_LIMIT, memory);
        note(CUDA_DEVICE_MEMORY_LIMIT, matches!(default_limit, Read::Bad));
        let mut limits = [0u64; MAX_DEVICES];
        for (i, limit) in limits.iter_mut().enumerate() {
            let name = env::memory_limit_var(i);
            *limit = match (read(&vars, &name, memory), &default_limit) {
                (Read::Set(v), _) => v,
                (Read::Bad, _) => {
                    note(&name, true);
                    0
                }
                (Read::Unset, Read::Set(v)) => *v,
                (Read::Unset, _) => 0,
            };
        }
        let default_sm = read(&vars, CUDA_DEVICE_SM_LIMIT, sm);
        note(CUDA_DEVICE_SM_LIMIT, matches!(default_sm, Read::Bad));
        let mut sm_limits = [0u8; MAX_DEVICES];
        for (i, limit) in sm_limits.iter_mut().enumerate() {
            let name = sm_limit_var(i);
            *limit = match (read(&vars, &name, sm), &default_sm) {
                (Read::Set(v), _) => v,
                (Read::Bad, _) => {
                    note(&name, true);
                    0
                }
                (Read::Unset, Read::Set(v)) => *v,
                (Read::Unset, _) => 0,
            };
        }
        let policy = read(&vars, GPU_CORE_UTILIZATION_POLICY, |v| {
            CoreUtilizationPolicy::parse(v).ok()
        });
        note(GPU_CORE_UTILIZATION_POLICY, matches!(policy, Read::Bad));
        let priority = read(&vars, CUDA_TASK_PRIORITY, |v| parse_priority(v).ok());
        note(CUDA_TASK_PRIORITY, matches!(priority, Read::Bad));
        // A log level that is not UTF-8 is an error; a malformed one only warns.
        let log_not_unicode = vars
            .get(LIBCUDA_LOG_LEVEL)
            .is_some_and(|v| v.to_str().is_none());
        note(LIBCUDA_LOG_LEVEL, log_not_unicode);

        match (result, first_bad) {
            (Err(error), Some(name)) => {
                let message = error.to_string();
                prop_assert!(
                    message.starts_with(&format!("{name}="))
                        || message == format!("{name} is not valid UTF-8"),
                    "expected {name} to be named: {message}"
                );
                prop_assert!(message.len() <= 4 * input + 256, "{message}");
            }
            (Ok((config, warning)), None) => {
                prop_assert_eq!(config.disabled, matches!(disabled, Read::Set(true)));
                prop_assert_eq!(config.limits, limits);
                prop_assert_eq!(config.sm_limits, sm_limits);
                prop_assert!(config.sm_limits.iter().all(|&p| p < 100));
                prop_assert_eq!(
                    config.core_policy,
                    match policy {
                        Read::Set(p) => p,
                        _ => CoreUtilizationPolicy::Default,
                    }
                );
                prop_assert_eq!(
                    config.priority,
                    match priority {
                        Read::Set(p) => p,
                        _ => Priority::Low,
                    }
                );
                let region = vars
                    .get(CUDA_DEVICE_MEMORY_SHARED_CACHE)
                    .map_or_else(|| PathBuf::from(DEFAULT_REGION_PATH), PathBuf::from);
                prop_assert_eq!(&config.region_path, &region);
                let level = vars
                    .get(LIBCUDA_LOG_LEVEL)
                    .and_then(|v| v.to_str())
                    .map(env::parse_log_level);
                match level {
                    Some(Ok(level)) => prop_assert!(config.log_level == level && warning.is_none()),
                    Some(Err(_)) => {
                        prop_assert_eq!(config.log_level, crate::log::WARN);
                        let warning = warning.map(|w| w.to_string()).unwrap_or_default();
                        prop_assert!(
                            warning.starts_with(&format!("{LIBCUDA_LOG_LEVEL}=")),
                            "{warning}"
                        );
                    }
                    None => prop_assert!(config.log_level == crate::log::WARN && warning.is_none()),
                }
            }
            (got, want) => {
                return Err(TestCaseError::fail(format!(
                    "got {got:?}, the model expected the first malformed variable to be {want:?}"
                )));
            }
        }
        Ok(())
    });
    if let Err(error) = outcome {
        panic!("fuzz_interposer_env: {error}");
    }
    eprintln!(
        "fuzz_interposer_env: {} cases in {:.2?}",
        runner.config().cases,
        started.elapsed()
    );
}

/// A limits file's text: lines of limit and other variables with any
/// values, now and then a malformed line, or anything at all.
fn limits_text() -> impl Strategy<Value = String> {
    let names = names();
    let count = names.len();
    let line = prop_oneof![
        6 => ((0..count).prop_map(move |i| names[i].clone()), "[ -~]{0,12}")
            .prop_map(|(n, v)| format!("{n}={v}")),
        1 => "\\PC{0,20}",
        1 => Just(String::new()),
    ];
    prop_oneof![
        8 => proptest::collection::vec(line, 0..10).prop_map(|l| l.join("\n")),
        1 => any::<String>(),
    ]
}

#[test]
fn fuzz_limits_file() {
    let mut runner = runner();
    let outcome = runner.run(&(limits_text(), vars()), |(text, env_vars)| {
        let env_list: Vec<(OsString, OsString)> = env_vars
            .iter()
            .map(|(k, v)| (OsString::from(k), v.clone()))
            .collect();
        let Ok(vars) = limits::Vars::new(Some(&text), env_list) else {
            // Refused: a malformed file, or a limit the environment
            // changes; never a panic.
            return Ok(());
        };
        let parsed =
            env::parse_limits_file(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for name in names() {
            let from_file = parsed
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v));
            let got = vars.get(&name);
            if env::is_limit_var(&name) {
                // Accepted: every limit comes from the file, and the
                // environment said the same or nothing.
                prop_assert_eq!(&got, &from_file);
                if let Some(value) = env_vars.get(&name) {
                    prop_assert_eq!(Some(value), from_file.as_ref());
                }
            } else {
                prop_assert_eq!(got, env_vars.get(&name).cloned());
            }
        }
        // What the agent writes, the interposer reads back as written.
        let pairs: Vec<(&str, &str)> = parsed
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let again = env::parse_limits_file(&env::format_limits_file(pairs))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(again.len(), parsed.len());
        Ok(())
    });
    if let Err(error) = outcome {
        panic!("fuzz_limits_file: {error}");
    }
}
