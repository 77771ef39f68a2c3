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
/// A window in which the host kept a probe from running for this long (its
/// watchdog thread woke this late, `stall_<i>`) does not measure the
/// limiter: 50 ms is the tolerance's share of a 1 s window.
pub const STALL_MS: u64 = 50;

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
        let stalls = (0..count)
            .map(|i| value(&format!("stall_{i}")).unwrap_or(0))
            .collect();
        (
            windows,
            Output {
                what: self.what,
                stdout,
                per_thread_calls,
                own,
                stalls,
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
    /// How long the host kept the probe from running at worst in each
    /// window, ms (`stall_<i>`).
    pub stalls: Vec<u64>,
}

impl Output {
    /// Whether the host stalled the probe in window `i` (see [`STALL_MS`]).
    pub fn stalled(&self, i: usize) -> bool {
        self.stalls.get(i).is_some_and(|&ms| ms >= STALL_MS)
    }

    /// Whether the host stalled the probe in any window: a stall that
    /// spans a window's end also costs the probe a window.
    pub fn host_stalled(&self) -> bool {
        (0..self.stalls.len()).any(|i| self.stalled(i))
    }

    /// The windows the limiter alone shaped: `values[i]` for every window
    /// after the first `settle` that the host did not stall, with its index.
    pub fn checked<'a>(
        &'a self,
        values: &'a [u64],
        settle: usize,
    ) -> impl Iterator<Item = (usize, u64)> + 'a {
        values
            .iter()
            .copied()
            .enumerate()
            .skip(settle)
            .filter(move |&(i, w)| {
                let stalled = self.stalled(i);
                if stalled {
                    eprintln!(
                        "{}: window {i} ({w} %) not checked: the host stalled the probe {} ms",
                        self.what, self.stalls[i]
                    );
                }
                !stalled
            })
    }
}

/// Asserts the probe printed at least `count` windows, unless the host
/// stalled it (a stall across a window's end leaves that window out).
pub fn assert_windows(windows: &[u64], count: usize, output: &Output) {
    assert!(
        windows.len() >= count || output.host_stalled(),
        "{}: {} windows, expected {count}:\n{}",
        output.what,
        windows.len(),
        output.stdout
    );
}

/// Asserts every window after the first (settling) is within the tolerance.
pub fn assert_near(windows: &[u64], target: u64, output: &Output) {
    assert_near_after(windows, target, 1, output);
}

/// Asserts every window after the first `settle` is within the tolerance.
pub fn assert_near_after(windows: &[u64], target: u64, settle: usize, output: &Output) {
    // Shown with --nocapture: the figures docs/interposer.md quotes.
    eprintln!("{}: target {target} %, windows {windows:?}", output.what);
    assert_windows(windows, settle + 1, output);
    for (i, w) in output.checked(windows, settle) {
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
    assert_windows(windows, 1, output);
    for (_, w) in output.checked(windows, 1) {
        assert!(
            w >= UNTHROTTLED,
            "{}: throttled to {w} %:\n{}",
            output.what,
            output.stdout
        );
    }
}
