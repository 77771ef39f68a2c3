//! How long things have waited, for the metrics the alerts watch: the
//! oldest allocation still `Bound`, the NodeLocks against their TTL, each
//! node agent's Lease since its last renewal. Pure: the caller passes `now`.

use k8s_openapi::jiff::Timestamp;

/// Seconds from `then` to `now`; never negative (a clock a little ahead of
/// ours reads as "just now").
pub fn seconds_since(then: Timestamp, now: Timestamp) -> f64 {
    now.duration_since(then).as_secs_f64().max(0.0)
}

/// Seconds since the earliest of `times`; 0 when there is none.
pub fn oldest_age_seconds(times: impl IntoIterator<Item = Timestamp>, now: Timestamp) -> f64 {
    times
        .into_iter()
        .min()
        .map_or(0.0, |oldest| seconds_since(oldest, now))
}

/// When a NodeLock was taken (or last renewed) and when it lapses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockTimes {
    /// `spec.acquiredAt`.
    pub acquired_at: Timestamp,
    /// `spec.expiresAt` (`acquiredAt + ttlSeconds`).
    pub expires_at: Timestamp,
}

/// The NodeLocks summed up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LockAges {
    /// How many locks exist.
    pub count: usize,
    /// How many are past their expiry: the lifecycle controller deletes a
    /// lock at its expiry, so one that stays expired means it is not running.
    pub expired: usize,
    /// Seconds since the oldest lock was taken; 0 without locks.
    pub oldest_age_seconds: f64,
}

/// Sums up `locks` at `now`.
pub fn lock_ages(locks: impl IntoIterator<Item = LockTimes>, now: Timestamp) -> LockAges {
    let mut ages = LockAges::default();
    let mut oldest: Option<Timestamp> = None;
    for lock in locks {
        ages.count += 1;
        if lock.expires_at <= now {
            ages.expired += 1;
        }
        oldest = Some(oldest.map_or(lock.acquired_at, |o| o.min(lock.acquired_at)));
    }
    ages.oldest_age_seconds = oldest_age_seconds(oldest, now);
    ages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn ages_count_from_the_oldest_and_never_go_negative() {
        let now = at("2026-01-01T00:01:00Z");
        assert_eq!(seconds_since(at("2026-01-01T00:00:30Z"), now), 30.0);
        assert_eq!(seconds_since(at("2026-01-01T00:02:00Z"), now), 0.0);
        assert_eq!(
            oldest_age_seconds(
                [at("2026-01-01T00:00:50Z"), at("2026-01-01T00:00:15Z")],
                now
            ),
            45.0
        );
        assert_eq!(oldest_age_seconds([], now), 0.0);
    }

    #[test]
    fn locks_past_their_expiry_are_counted_as_expired() {
        let now = at("2026-01-01T00:01:00Z");
        let lock = |acquired: &str, expires: &str| LockTimes {
            acquired_at: at(acquired),
            expires_at: at(expires),
        };
        let ages = lock_ages(
            [
                // Taken 90 s ago with a 60 s TTL: expired 30 s ago.
                lock("2025-12-31T23:59:30Z", "2026-01-01T00:00:30Z"),
                // Taken 10 s ago, 50 s left.
                lock("2026-01-01T00:00:50Z", "2026-01-01T00:01:50Z"),
                // Expires this very second: expired.
                lock("2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"),
            ],
            now,
        );
        assert_eq!(
            ages,
            LockAges {
                count: 3,
                expired: 2,
                oldest_age_seconds: 90.0
            }
        );
        assert_eq!(lock_ages([], now), LockAges::default());
    }
}
