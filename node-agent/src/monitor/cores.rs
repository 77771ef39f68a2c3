//! Compute use per container device: how fast the GPU time in its region
//! grows. The interposer adds each limited launch's GPU time to its device's
//! `busy_ns` (corrected from NVML's per-process samples where the driver
//! has them), so the growth of `busy_ns` over a window of wall time is the
//! share of the GPU's SMs the container used in that window.
//!
//! The rate is taken between two reads at least [`MIN_WINDOW_NS`] apart, so
//! two scrapers a second apart do not each see a one-second window; a read
//! sooner than that reports the last window's rate. The region is the
//! container's to write: a count that goes backwards (a region made anew,
//! or written by its container) gives no rate for that window, and a rate
//! is at most 100 %, what a GPU can give. It is not clamped to the
//! container's limit: the limiter lets a container that was idle run a
//! little over its limit for a moment (25 ms of saved-up GPU time), and
//! `used / limit` is how the tuning guide checks that the limit holds.

use std::{collections::BTreeMap, sync::Mutex};

use super::usage::Usage;

/// The shortest window a rate is taken over, ns.
pub const MIN_WINDOW_NS: u64 = 5_000_000_000;

/// A container device's compute use, percent of the GPU's SMs, by region
/// directory name and CUDA ordinal.
pub type CoreUse = BTreeMap<(String, usize), u8>;

/// The last window's start and rate of one container device.
#[derive(Clone, Copy, Debug)]
struct Track {
    busy_ns: u64,
    at_ns: u64,
    percent: Option<u8>,
}

/// The rates of every container device the agent has read, between reads.
#[derive(Debug, Default)]
pub struct CoreRates {
    tracks: Mutex<BTreeMap<(String, usize), Track>>,
}

impl CoreRates {
    /// Takes in one read of the regions at `now_ns` (`CLOCK_MONOTONIC`) and
    /// answers each container device's rate over the last window that
    /// ended; none for a device read for the first time or whose count went
    /// backwards. Devices no longer read are forgotten.
    pub fn observe(&self, usage: &Usage, now_ns: u64) -> CoreUse {
        // A panic elsewhere while holding the lock leaves plain numbers.
        let mut tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        tracks.retain(|key, _| usage.contains_key(key));
        let mut rates = CoreUse::new();
        for (key, reading) in usage {
            let track = tracks.entry(key.clone()).or_insert(Track {
                busy_ns: reading.busy_ns,
                at_ns: now_ns,
                percent: None,
            });
            let window = now_ns.saturating_sub(track.at_ns);
            if window >= MIN_WINDOW_NS {
                *track = Track {
                    busy_ns: reading.busy_ns,
                    at_ns: now_ns,
                    percent: percent(reading.busy_ns.checked_sub(track.busy_ns), window),
                };
            }
            if let Some(percent) = track.percent {
                rates.insert(key.clone(), percent);
            }
        }
        rates
    }
}

/// `busy` ns of GPU time in `window` ns of wall time, in percent rounded to
/// the nearest, at most 100; `None` when the count went backwards.
fn percent(busy: Option<u64>, window: u64) -> Option<u8> {
    let busy = u128::from(busy?);
    let window = u128::from(window.max(1));
    let percent = ((busy * 100 + window / 2) / window).min(100);
    u8::try_from(percent).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::usage::Reading;

    const S: u64 = 1_000_000_000;

    fn usage(busy: &[(&str, u64)]) -> Usage {
        busy.iter()
            .map(|&(dir, busy_ns)| {
                (
                    (dir.to_owned(), 0),
                    Reading {
                        busy_ns,
                        ..Reading::default()
                    },
                )
            })
            .collect()
    }

    fn rate(rates: &CoreUse, dir: &str) -> Option<u8> {
        rates.get(&(dir.to_owned(), 0)).copied()
    }

    #[test]
    fn the_rate_is_busy_time_over_a_window_of_at_least_five_seconds() {
        let rates = CoreRates::default();
        assert!(rates.observe(&usage(&[("a", 7 * S)]), 100 * S).is_empty());
        // 1 s later: too short a window, and none ended before.
        assert!(rates.observe(&usage(&[("a", 8 * S)]), 101 * S).is_empty());
        // 10 s after the first read, 3 s of GPU time: 30 %.
        let r = rates.observe(&usage(&[("a", 10 * S)]), 110 * S);
        assert_eq!(rate(&r, "a"), Some(30));
        // A read 2 s later repeats the last window's rate...
        let r = rates.observe(&usage(&[("a", 12 * S)]), 112 * S);
        assert_eq!(rate(&r, "a"), Some(30));
        // ...and the next window starts where that one ended: 1.5 s in 5 s.
        let r = rates.observe(&usage(&[("a", 23 * S / 2)]), 115 * S);
        assert_eq!(rate(&r, "a"), Some(30));
        let r = rates.observe(&usage(&[("a", 23 * S / 2 + 2 * S)]), 120 * S);
        assert_eq!(rate(&r, "a"), Some(40));
    }

    #[test]
    fn a_count_that_goes_backwards_or_races_ahead_is_not_believed() {
        let rates = CoreRates::default();
        rates.observe(&usage(&[("a", 50 * S), ("b", 0)]), 0);
        // a's region was made anew (or written by its container); b claims
        // more GPU time than wall time passed.
        let r = rates.observe(&usage(&[("a", S), ("b", u64::MAX)]), 10 * S);
        assert_eq!(rate(&r, "a"), None);
        assert_eq!(rate(&r, "b"), Some(100));
        // a counts from its new start.
        let r = rates.observe(&usage(&[("a", 6 * S), ("b", u64::MAX)]), 20 * S);
        assert_eq!(rate(&r, "a"), Some(50));
        assert_eq!(rate(&r, "b"), Some(0));
    }

    #[test]
    fn devices_no_longer_read_are_forgotten() {
        let rates = CoreRates::default();
        rates.observe(&usage(&[("a", 0)]), 0);
        rates.observe(&usage(&[]), 10 * S);
        // a comes back (a container restarted in the same directory): a new
        // first read, no rate from the old one.
        assert!(rates.observe(&usage(&[("a", 9 * S)]), 20 * S).is_empty());
        let r = rates.observe(&usage(&[("a", 9 * S)]), 30 * S);
        assert_eq!(rate(&r, "a"), Some(0));
    }

    #[test]
    fn an_idle_clock_or_a_huge_window_does_not_overflow() {
        assert_eq!(percent(Some(u64::MAX), u64::MAX), Some(100));
        assert_eq!(percent(Some(0), 0), Some(0));
        assert_eq!(percent(Some(1), u64::MAX), Some(0));
        assert_eq!(percent(None, 5 * S), None);
    }
}
