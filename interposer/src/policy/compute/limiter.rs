//! The compute limiter: a token bucket per device in the region, refilled
//! at the limit's share of wall time; a launch waits while the budget is
//! negative, is charged an estimate, and is measured by two events (see the
//! module docs of `policy/compute`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tessera_api::env::CoreUtilizationPolicy;
use tessera_vgpu_region::{MAX_DEVICES, Priority, Region, Sharing, SlotId};

use crate::driver::cuda::driver;
use crate::driver::queries::current_device;
use crate::log::{INFO, WARN};
use crate::policy::compute::usage::Usage;
use crate::sys::{
    CU_EVENT_DEFAULT, CU_STREAM_CAPTURE_STATUS_NONE, CUDA_ERROR_NOT_READY, CUDA_SUCCESS, CUcontext,
    CUevent, CUresult, CUstream,
};

/// The most GPU time a container can save up while it launches nothing: what
/// it may then run at full speed before the limit bites again, and so how far
/// above the limit one second can run (2.5 points).
pub(crate) const CAP_NS: i64 = 25_000_000;
/// Shortest and longest sleep while waiting for budget: the budget is checked
/// again after each (other processes may have refilled or measured).
const MIN_WAIT_NS: u64 = 50_000;
const MAX_WAIT_NS: u64 = 20_000_000;
/// How long to wait between polls for the first measurement on a device.
const BOOTSTRAP_POLL_NS: u64 = 200_000;
/// How long a held launch sleeps before it looks at the hold again.
const HOLD_POLL_NS: u64 = 2_000_000;

/// A launch whose events have not been read yet.
struct Pending {
    dev: usize,
    /// The kernel or graph handle (its estimate's key).
    handle: usize,
    ctx: usize,
    start: usize,
    end: usize,
    /// What it was charged when it was launched, ns.
    charged: u64,
}

/// Per-process state of the compute limiter.
pub(crate) struct Limiter {
    percent: [u8; MAX_DEVICES],
    policy: CoreUtilizationPolicy,
    inner: Mutex<Inner>,
    /// Running average of measured launch durations per device, ns (0:
    /// nothing measured yet).
    average: [AtomicU64; MAX_DEVICES],
    /// Corrections from NVML's per-process utilisation.
    usage: Usage,
}

#[derive(Default)]
struct Inner {
    pending: Vec<Pending>,
    /// Estimated duration per kernel or graph handle, ns.
    estimates: HashMap<usize, u64>,
    /// Completed event pairs, per context, ready to be recorded again.
    free_events: HashMap<usize, Vec<(usize, usize)>>,
    /// Whether creating events already failed once (logged once).
    events_failed: bool,
}

impl Limiter {
    /// A limiter for these per-device limits (percent, 0 = none), unless no
    /// device has one or the policy disables them, and the container's
    /// priority is low: a high-priority container always records its
    /// launches, so that the node agent can hold lower ones back.
    pub(crate) fn new(
        percent: [u8; MAX_DEVICES],
        policy: CoreUtilizationPolicy,
        priority: Priority,
    ) -> Option<Self> {
        let limits = policy != CoreUtilizationPolicy::Disable && percent.iter().any(|&p| p != 0);
        if !limits && priority != Priority::High {
            return None;
        }
        Some(Self {
            percent,
            policy,
            inner: Mutex::new(Inner::default()),
            average: std::array::from_fn(|_| AtomicU64::new(0)),
            usage: Usage::new(),
        })
    }

    /// The per-device limits, percent.
    pub(crate) fn percent(&self) -> [u8; MAX_DEVICES] {
        self.percent
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a launch (`call`) on `stream` under device `dev`'s limit: waits for
    /// budget, charges an estimate, and brackets it with events to measure it.
    pub(crate) fn launch(
        &self,
        region: &Region,
        slot: Option<SlotId>,
        stream: CUstream,
        handle: *mut c_void,
        per_thread: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let Ok(dev) = current_device().map(usize::try_from) else {
            return call();
        };
        let Ok(dev) = dev else {
            return call();
        };
        if let Some(slot) = slot {
            // For the node agent's priority arbitration.
            region.record_launch(slot, dev, now_ns());
        }
        let Some(percent) = self
            .percent
            .get(dev)
            .copied()
            .filter(|&p| p != 0 && self.policy != CoreUtilizationPolicy::Disable)
        else {
            return call();
        };
        if self.policy == CoreUtilizationPolicy::Default
            && region.sharing(dev) == Sharing::Exclusive
        {
            self.usage.restart(dev);
            return call();
        }
        let mut capture = CU_STREAM_CAPTURE_STATUS_NONE;
        let rc = if per_thread {
            real!(cuStreamIsCapturing_ptsz(stream, &mut capture))
        } else {
            real!(cuStreamIsCapturing(stream, &mut capture))
        };
        if rc == CUDA_SUCCESS && capture != CU_STREAM_CAPTURE_STATUS_NONE {
            // Recorded into a graph, not run: charged when the graph runs.
            return call();
        }
        self.admit(region, slot, dev, percent);

        let estimate = self.estimate(dev, handle as usize);
        let ctx = current_context();
        let events = ctx.and_then(|ctx| self.events(ctx));
        let record = |event: usize| {
            let event = event as CUevent;
            if per_thread {
                real!(cuEventRecord_ptsz(event, stream))
            } else {
                real!(cuEventRecord(event, stream))
            }
        };
        region.charge(dev, estimate as i64);
        let started = events.is_some_and(|(start, _)| record(start) == CUDA_SUCCESS);
        let rc = call();
        if rc != CUDA_SUCCESS {
            region.charge(dev, -(estimate as i64));
        }
        match (events, ctx) {
            (Some((start, end)), Some(ctx))
                if rc == CUDA_SUCCESS && started && record(end) == CUDA_SUCCESS =>
            {
                self.inner().pending.push(Pending {
                    dev,
                    handle: handle as usize,
                    ctx,
                    start,
                    end,
                    charged: estimate,
                });
            }
            (Some(pair), Some(ctx)) => self.recycle(ctx, pair),
            _ => {}
        }
        rc
    }

    /// Waits while the node agent holds launches on `dev` back (a
    /// higher-priority container is active on its GPU) and until device
    /// `dev`'s budget is not negative (and, before the first measurement,
    /// until launches in flight have been measured).
    fn admit(&self, region: &Region, slot: Option<SlotId>, dev: usize, percent: u8) {
        let mut waited = 0u64;
        let mut held = false;
        loop {
            self.settle(region);
            self.usage.sample(region, slot, dev, now_ns());
            let unmeasured = self.average[dev].load(Ordering::Relaxed) == 0
                && self.inner().pending.iter().any(|p| p.dev == dev);
            let now = now_ns();
            let tokens = region.refill(dev, now, percent, CAP_NS);
            let wait = if region.held(dev, now) {
                held = true;
                HOLD_POLL_NS
            } else if tokens < 0 {
                (tokens.unsigned_abs().saturating_mul(100) / u64::from(percent))
                    .clamp(MIN_WAIT_NS, MAX_WAIT_NS)
            } else if unmeasured {
                BOOTSTRAP_POLL_NS
            } else {
                break;
            };
            let before = now_ns();
            std::thread::sleep(Duration::from_nanos(wait));
            waited += now_ns() - before;
        }
        if held {
            // What was learned before the hold (e.g. queueing behind the
            // holder) no longer holds.
            self.usage.restart(dev);
        }
        region.record_compute(dev, 0, waited);
    }

    /// Reads the events of completed launches: each is charged its measured
    /// time instead of its estimate, and its handle's estimate is updated.
    ///
    /// The driver is called without the lock held (the pending launches are
    /// taken out, and those still running are put back).
    fn settle(&self, region: &Region) {
        let pending = std::mem::take(&mut self.inner().pending);
        if pending.is_empty() {
            return;
        }
        let mut running = Vec::new();
        let mut done = Vec::new();
        for p in pending {
            match real!(cuEventQuery(p.end as CUevent)) {
                CUDA_ERROR_NOT_READY => running.push(p),
                CUDA_SUCCESS => {
                    let mut ms = 0f32;
                    let rc = real!(cuEventElapsedTime(
                        &mut ms,
                        p.start as CUevent,
                        p.end as CUevent
                    ));
                    let measured =
                        (rc == CUDA_SUCCESS).then(|| (f64::from(ms.max(0.0)) * 1e6) as u64);
                    done.push((p, measured));
                }
                // The events are unusable (e.g. their context is gone): the
                // estimate stands.
                _ => {}
            }
        }
        let mut inner = self.inner();
        inner.pending.append(&mut running);
        for (p, measured) in done {
            if let Some(ns) = measured {
                let charged = self.usage.scale(p.dev, ns);
                region.charge(p.dev, charged as i64 - p.charged as i64);
                region.record_compute(p.dev, charged, 0);
                self.usage.settled(p.dev, ns, charged);
                let ns = ns.max(1);
                let average = &self.average[p.dev];
                let old = average.load(Ordering::Relaxed);
                average.store(
                    if old == 0 { ns } else { (old * 7 + ns) / 8 },
                    Ordering::Relaxed,
                );
                inner
                    .estimates
                    .entry(p.handle)
                    .and_modify(|e| *e = (*e * 3 + ns) / 4)
                    .or_insert(ns);
            }
            inner
                .free_events
                .entry(p.ctx)
                .or_default()
                .push((p.start, p.end));
        }
    }

    /// What a launch of `handle` on `dev` is charged before it is measured:
    /// its estimated duration (scaled as its measured time will be), ns.
    fn estimate(&self, dev: usize, handle: usize) -> u64 {
        let known = self.inner().estimates.get(&handle).copied();
        let raw = known.unwrap_or_else(|| self.average[dev].load(Ordering::Relaxed));
        self.usage.scale(dev, raw)
    }

    /// A pair of events of context `ctx` ready to be recorded.
    fn events(&self, ctx: usize) -> Option<(usize, usize)> {
        let reused = self.inner().free_events.get_mut(&ctx).and_then(Vec::pop);
        if reused.is_some() {
            return reused;
        }
        let mut start: CUevent = std::ptr::null_mut();
        let mut end: CUevent = std::ptr::null_mut();
        let rc = real!(cuEventCreate(&mut start, CU_EVENT_DEFAULT));
        let rc = if rc == CUDA_SUCCESS {
            real!(cuEventCreate(&mut end, CU_EVENT_DEFAULT))
        } else {
            rc
        };
        if rc != CUDA_SUCCESS {
            let mut inner = self.inner();
            if !inner.events_failed {
                inner.events_failed = true;
                log!(
                    WARN,
                    "cannot create events to measure launches (error {rc}); launches are charged estimates only"
                );
            }
            return None;
        }
        log!(INFO, "created a pair of timing events for context {ctx:#x}");
        Some((start as usize, end as usize))
    }

    fn recycle(&self, ctx: usize, pair: (usize, usize)) {
        self.inner().free_events.entry(ctx).or_default().push(pair);
    }
}

/// The calling thread's current context, if any, as the key of its events:
/// its `cuCtxGetId` (CUDA 12+, never reused, so a context created later at
/// the same address never gets a destroyed one's events), else its address.
fn current_context() -> Option<usize> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    if real!(cuCtxGetCurrent(&mut ctx)) != CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let mut id = 0u64;
    if driver().fns.cuCtxGetId.is_some() && real!(cuCtxGetId(ctx, &mut id)) == CUDA_SUCCESS {
        // Ids are small counters; the high bit keeps them apart from addresses.
        return Some((id | 1 << 63) as usize);
    }
    Some(ctx as usize)
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock every process of the machine
/// shares (the region's refill time is in it).
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limiter_exists_for_a_limit_the_policy_applies_or_a_high_priority() {
        let mut percent = [0; MAX_DEVICES];
        let low = Priority::Low;
        for policy in [
            CoreUtilizationPolicy::Default,
            CoreUtilizationPolicy::Force,
            CoreUtilizationPolicy::Disable,
        ] {
            assert!(Limiter::new(percent, policy, low).is_none(), "{policy:?}");
            // A high-priority container records its launches in any case.
            assert!(Limiter::new(percent, policy, Priority::High).is_some());
        }
        percent[3] = 30;
        assert!(Limiter::new(percent, CoreUtilizationPolicy::Disable, low).is_none());
        for policy in [CoreUtilizationPolicy::Default, CoreUtilizationPolicy::Force] {
            let limiter = Limiter::new(percent, policy, low).unwrap();
            assert_eq!(limiter.percent()[3], 30);
            assert_eq!(limiter.percent()[0], 0);
        }
    }
}
