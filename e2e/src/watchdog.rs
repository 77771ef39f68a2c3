//! A deadline for one test, so a hang fails the test run instead of
//! stalling CI until its own limit kills everything without a word.
//!
//! Every [`crate::ControlPlane`] a test starts carries a [`Watchdog`]: when
//! the test (its thread, which ends after its runtime has shut down) still
//! runs after the limit (default 10 minutes, `TESSERA_TEST_TIMEOUT_SECS`
//! overrides), the watchdog names the test and exits the test process with
//! status 124. Every component dies with it (they are
//! [`crate::process::Lifetime::Tied`]).

use std::{
    io::Write,
    sync::mpsc::{self, RecvTimeoutError},
    thread,
    time::Duration,
};

/// Variable that sets the limit in seconds.
pub const LIMIT_VAR: &str = "TESSERA_TEST_TIMEOUT_SECS";
/// The limit when [`LIMIT_VAR`] is unset or unparsable.
const DEFAULT_LIMIT: Duration = Duration::from_secs(600);

/// Armed on creation, disarmed on drop.
#[derive(Debug)]
pub struct Watchdog {
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    /// Arms a watchdog for the calling thread's test with the configured
    /// limit; `context` (e.g. where the logs are) is printed when it fires.
    pub fn arm(context: &str) -> Self {
        let limit = std::env::var(LIMIT_VAR)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(DEFAULT_LIMIT, Duration::from_secs);
        Self::arm_for(limit, context)
    }

    /// Arms a watchdog that fires after `limit`.
    pub fn arm_for(limit: Duration, context: &str) -> Self {
        let context = context.to_owned();
        // libtest names each test's thread after the test.
        let test = thread::current()
            .name()
            .unwrap_or("an unnamed thread")
            .to_owned();
        let (disarm, armed) = mpsc::channel::<()>();
        let spawned = thread::Builder::new()
            .name("tessera-e2e-watchdog".into())
            .spawn(move || {
                if let Err(RecvTimeoutError::Timeout) = armed.recv_timeout(limit) {
                    // Not eprintln!: libtest captures that for the test's
                    // threads, and the capture is lost when the process exits.
                    let _ = writeln!(
                        std::io::stderr(),
                        "tessera-e2e watchdog: {test} still runs after {} s ({LIMIT_VAR}); \
                         stopping the test process so the hang is reported; {context}",
                        limit.as_secs()
                    );
                    std::process::exit(124);
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "no watchdog thread; this test has no deadline");
        }
        Self { _disarm: disarm }
    }
}

impl Watchdog {
    /// Keeps the deadline until the calling thread exits instead of now:
    /// a test's thread exits only after its runtime has shut down, and a
    /// shutdown can hang too (a task spinning without yielding).
    pub fn until_thread_exit(self) {
        thread_local! {
            static KEPT: std::cell::RefCell<Vec<Watchdog>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        // Fails only while the thread is already exiting: then dropping now
        // is what would happen anyway.
        let _ = KEPT.try_with(|kept| kept.borrow_mut().push(self));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_watchdog_never_fires() {
        // Fires only if the process is still alive 200 ms after the drop
        // would have let it time out; the test then dies with status 124.
        drop(Watchdog::arm_for(
            Duration::from_millis(100),
            "logs: nowhere",
        ));
        thread::sleep(Duration::from_millis(300));
    }

    /// Run only by `a_hung_shutdown_is_caught_after_the_watchdog_is_handed_on`.
    #[test]
    #[ignore = "hangs on purpose; run in a child process by another test"]
    fn hangs_after_handing_the_watchdog_on() {
        Watchdog::arm_for(Duration::from_millis(100), "logs: nowhere").until_thread_exit();
        thread::sleep(Duration::from_secs(30));
    }

    #[test]
    fn a_hung_shutdown_is_caught_after_the_watchdog_is_handed_on() {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "watchdog::tests::hangs_after_handing_the_watchdog_on",
            ])
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(124),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // Handed on and the thread exits: it never fires.
        thread::spawn(|| {
            Watchdog::arm_for(Duration::from_millis(100), "logs: nowhere").until_thread_exit();
        })
        .join()
        .unwrap();
        thread::sleep(Duration::from_millis(300));
    }

    /// Run only by `a_hung_test_is_stopped_and_named`, in a child process.
    #[test]
    #[ignore = "hangs on purpose; run in a child process by another test"]
    fn hangs_past_its_deadline() {
        let _watchdog = Watchdog::arm_for(Duration::from_millis(100), "logs: nowhere");
        thread::sleep(Duration::from_secs(30));
    }

    #[test]
    fn a_hung_test_is_stopped_and_named() {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "watchdog::tests::hangs_past_its_deadline",
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(124), "{stderr}");
        assert!(
            stderr.contains("watchdog::tests::hangs_past_its_deadline still runs after 0 s")
                && stderr.contains("logs: nowhere"),
            "{stderr}"
        );
    }
}
