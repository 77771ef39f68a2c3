//! Probes that launch kernels for a while and report the utilisation of
//! each 1 s window (`tests/c/probe.c`, command `launch`), for the compute
//! tests.

use std::process::{Child, Stdio};

use crate::{Loader, World};

/// Blocks per launch: 1 ms each at the fake's default 1000 ns per block.
pub const BLOCKS: &str = "1000";
/// Allowed distance from the target, percentage points (issue 5, section 6).
pub const TOLERANCE: i64 = 5;
/// An unthrottled probe keeps the device at least this busy.
pub const UNTHROTTLED: u64 = 80;

/// Serialises the tests of a test file, so that their probes do not starve
/// a 2-core machine (a probe that is not scheduled cannot launch, and its
/// device idles).
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A probe running `launch` in the background.
pub struct Run {
    child: Child,
    what: String,
}

impl Run {
    /// Starts `launch` over `path` for `seconds` with [`BLOCKS`] blocks per
    /// launch.
    pub fn start(world: &World, loader: Loader, preload: bool, path: &str, seconds: &str) -> Self {
        Self::start_blocks(world, loader, preload, path, seconds, BLOCKS)
    }

    /// Starts `launch` with `blocks` blocks per launch.
    pub fn start_blocks(
        world: &World,
        loader: Loader,
        preload: bool,
        path: &str,
        seconds: &str,
        blocks: &str,
    ) -> Self {
        let child = world
            .probe(loader, preload, &["launch", path, seconds, blocks])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Self {
            child,
            what: format!("{loader:?} preload={preload} {path} {blocks} blocks"),
        }
    }

    /// The probe's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The utilisation of each 1 s window, percent, and the probe's output.
    pub fn windows(self) -> (Vec<u64>, Output) {
        let output = self.child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "{} failed:\n{stdout}\n{stderr}",
            self.what
        );
        let value = |key: &str| -> Option<u64> {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(|v| v.parse().unwrap())
        };
        let count = value("windows").unwrap();
        let windows = (0..count)
            .map(|i| value(&format!("window_{i}")).unwrap())
            .collect();
        let per_thread_calls = value("per_thread_calls").unwrap_or(0);
        let own = (0..count)
            .filter_map(|i| value(&format!("own_{i}")))
            .collect();
        (
            windows,
            Output {
                what: self.what,
                stdout,
                per_thread_calls,
                own,
            },
        )
    }
}

/// What a finished probe printed.
pub struct Output {
    /// Which probe it was, for messages.
    pub what: String,
    /// Everything it printed to stdout.
    pub stdout: String,
    /// Its calls of `_ptsz` variants (`per_thread_calls`).
    pub per_thread_calls: u64,
    /// This process's own NVML utilisation in each window (`own_<i>`;
    /// empty when NVML has no per-process utilisation).
    pub own: Vec<u64>,
}

/// Asserts every window after the first (settling) is within the tolerance.
pub fn assert_near(windows: &[u64], target: u64, output: &Output) {
    // Shown with --nocapture: the figures docs/interposer.md quotes.
    eprintln!("{}: target {target} %, windows {windows:?}", output.what);
    assert!(windows.len() >= 2, "{}: {}", output.what, output.stdout);
    for (i, &w) in windows.iter().enumerate().skip(1) {
        assert!(
            (w as i64 - target as i64).abs() <= TOLERANCE,
            "{}: window {i} at {w} %, target {target} %:\n{}",
            output.what,
            output.stdout
        );
    }
}

/// Asserts every window after the first (settling) keeps the device at
/// least [`UNTHROTTLED`] percent busy.
pub fn assert_unthrottled(windows: &[u64], output: &Output) {
    eprintln!("{}: unthrottled, windows {windows:?}", output.what);
    assert!(!windows.is_empty(), "{}: {}", output.what, output.stdout);
    for &w in windows.iter().skip(1) {
        assert!(
            w >= UNTHROTTLED,
            "{}: throttled to {w} %:\n{}",
            output.what,
            output.stdout
        );
    }
}
