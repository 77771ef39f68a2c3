//! The compute fields of the device records: the compute limit, the
//! sharing mark the node agent writes, the container's budget (a token
//! bucket in nanoseconds of GPU time) and the compute metrics.

use std::sync::atomic::Ordering;

use crate::region::{Region, Sharing, SlotId};

impl Region {
    /// The compute limit of device `dev` in percent, `None` for none.
    pub fn sm_limit(&self, dev: usize) -> Option<u8> {
        let raw = self
            .layout()
            .devices
            .get(dev)?
            .sm_limit
            .load(Ordering::Relaxed);
        u8::try_from(raw).ok().filter(|&p| p != 0 && p < 100)
    }

    /// Whether device `dev` is shared with other containers (one relaxed load).
    pub fn sharing(&self, dev: usize) -> Sharing {
        self.layout()
            .devices
            .get(dev)
            .map_or(Sharing::Unknown, |d| {
                Sharing::from_raw(d.sharing.load(Ordering::Relaxed))
            })
    }

    /// Marks device `dev` shared or exclusive (the node agent, from its
    /// allocations on the GPU).
    pub fn set_sharing(&self, dev: usize, sharing: Sharing) {
        if let Some(d) = self.layout().devices.get(dev) {
            d.sharing.store(sharing.raw(), Ordering::Relaxed);
        }
    }

    /// Credits device `dev`'s compute budget with `percent` % of the wall
    /// time since the last refill (`now` in `CLOCK_MONOTONIC` nanoseconds),
    /// capped at `cap` ns, and returns the budget.
    ///
    /// One process wins each interval (a CAS on `refilled_at`), so the
    /// processes of a container never credit the same time twice.
    pub fn refill(&self, dev: usize, now: u64, percent: u8, cap: i64) -> i64 {
        let Some(d) = self.layout().devices.get(dev) else {
            return 0;
        };
        let last = d.refilled_at.load(Ordering::Acquire);
        if last == 0 {
            // The first launch of the container: start with an empty budget.
            let _ = d
                .refilled_at
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        } else if now > last
            && d.refilled_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            // `refilled_at` is the container's to write: saturate, never overflow.
            let credit =
                i64::try_from((now - last).saturating_mul(u64::from(percent)) / 100).unwrap_or(cap);
            let _ = d
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| {
                    Some(t.saturating_add(credit).min(cap))
                });
        }
        d.tokens.load(Ordering::Acquire)
    }

    /// Takes `ns` of GPU time from device `dev`'s budget (a negative `ns`
    /// gives back what an estimate over-charged).
    pub fn charge(&self, dev: usize, ns: i64) {
        if let Some(d) = self.layout().devices.get(dev) {
            d.tokens.fetch_sub(ns, Ordering::AcqRel);
        }
    }

    /// Device `dev`'s compute budget in nanoseconds.
    pub fn tokens(&self, dev: usize) -> i64 {
        self.layout()
            .devices
            .get(dev)
            .map_or(0, |d| d.tokens.load(Ordering::Acquire))
    }

    /// Adds measured GPU time and time spent waiting for budget (metrics).
    pub fn record_compute(&self, dev: usize, busy_ns: u64, throttled_ns: u64) {
        if let Some(d) = self.layout().devices.get(dev) {
            if busy_ns != 0 {
                d.busy_ns.fetch_add(busy_ns, Ordering::Relaxed);
            }
            if throttled_ns != 0 {
                d.throttled_ns.fetch_add(throttled_ns, Ordering::Relaxed);
            }
        }
    }

    /// Adds `delta` (possibly negative) to device `dev`'s measured busy
    /// time: a process's correction from NVML's per-process utilisation.
    pub fn adjust_busy(&self, dev: usize, delta: i64) {
        if let Some(d) = self.layout().devices.get(dev) {
            let _ = d
                .busy_ns
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |busy| {
                    Some(busy.saturating_add_signed(delta))
                });
        }
    }

    /// The host pid the node agent wrote into a slot, `None` when unknown.
    pub fn host_pid(&self, slot: SlotId) -> Option<u32> {
        let pid = self.layout().slots[slot.0].host_pid.load(Ordering::Relaxed);
        (pid != 0).then_some(pid)
    }
}
