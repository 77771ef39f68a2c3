//! What the container's processes really ran, from NVML's per-process
//! utilisation, to take out of the budget what events over-charge.
//!
//! The events around a launch measure the time from when it was enqueued
//! (its stream's earlier work done) to when it ended, which includes any
//! time it waited for the device while other processes' work ran. Where the
//! driver offers `nvmlDeviceGetProcessUtilization`, each process asks it
//! every [`SAMPLE_NS`] for the samples newer than the last one it used. The
//! driver takes a sample on its own clock (every 200 ms on an H100, driver
//! 580), each the `smUtil` % of the time since the one before; so the
//! process's GPU time is `smUtil` × the time since the previous sample, the
//! clock moves only to the newest sample's time, and when no new sample has
//! come the charges since wait for the one that covers them. With a sample,
//! the process gives the budget back what its launches were charged beyond
//! that time (or charges the difference, if NVML saw more: work launched
//! outside the hooks). Summed over samples the container is charged exactly
//! its processes' GPU time. (Moving the clock to the time of asking, and
//! reading "no new sample" as "no GPU time", gave back almost every charge
//! on a real H100: a 30 % limit ran at 87 %.) Between samples a settled
//! launch is charged its measured time scaled by the ratio of GPU time to
//! measured time of the
//! previous period ([`Usage::scale`]), so the budget stays close to the
//! truth and each sample's correction is small (charging the raw measured
//! time and refunding it in 100 ms chunks made the budget swing).
//!
//! A process's pid in NVML (the host's pid namespace) is its own pid when it
//! runs in the host's pid namespace, else its slot's `host_pid` once the
//! node agent has written it. Without that, or without the NVML function, or
//! when it fails, launches are charged their measured time as before (logged
//! once at level 3).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tessera_vgpu_region::{MAX_DEVICES, Region, SlotId};

use crate::accounting::pids::in_host_pid_namespace;
use crate::log::{DEBUG, INFO};
use crate::sys::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_NOT_FOUND, NVML_SUCCESS,
    nvmlProcessUtilizationSample_t,
};

/// How often a process asks NVML for new samples until it knows the
/// driver's sample period (an H100 with driver 580 takes one every 200 ms,
/// measured 2026-11-27); then it asks just after each sample is due.
pub(super) const SAMPLE_NS: u64 = 100_000_000;
/// How long after a sample's time it is asked for: the driver publishes a
/// sample a few ms after its time (about 6 ms on that H100).
const SLACK_US: u64 = 15_000;
/// How soon it asks again when the sample it expected has not come yet.
const RETRY_NS: u64 = 20_000_000;
/// Gaps between samples shorter than this are not taken for the period.
const MIN_PERIOD_US: u64 = 10_000;

/// A device on which this process asked nothing for this long after a
/// sample was due restarts its clock (the process was idle).
const IDLE_NS: u64 = 1_000_000_000;

/// The unit of [`Usage::scale`]'s ratio.
const PPM: u64 = 1_000_000;
/// Bounds of the ratio: at least 5 % of the measured time is charged between
/// samples, at most twice it.
const MIN_RATIO_PPM: u64 = 50_000;
const MAX_RATIO_PPM: u64 = 2_000_000;
/// A period with less measured time than this leaves the ratio as it was.
const MIN_MEASURED_NS: u64 = 1_000_000;
/// A period whose launches were gathered over a span this far (percent)
/// from the span its samples cover leaves the ratio as it was: the two
/// counts are of different times, and their quotient is not a ratio of GPU
/// time to measured time (when the process first learns the driver's
/// period its next query comes early: 130 ms of launches against 200 ms of
/// samples read as a ratio of 1.5, and at an eighth per period the charges
/// between samples stayed 20 % high for seconds).
const MAX_SPAN_SKEW_PERCENT: u64 = 20;

/// One device's sampling state in this process.
#[derive(Default)]
struct Sampler {
    /// NVML's time (`CLOCK_REALTIME` µs) up to which this process's work was
    /// accounted (while `starting`: when the clock was restarted).
    last_seen_us: u64,
    /// The clock was (re)started and waits for the first sample that
    /// begins after it.
    starting: bool,
    /// GPU time this process's settled launches were charged since then, ns.
    charged_ns: u64,
    /// Their measured (event) time, ns.
    measured_ns: u64,
    /// NVML cannot tell this process's time on this device: do not ask again.
    off: bool,
    /// The driver's sample period as seen (the shortest gap between two
    /// samples), µs; 0 until seen.
    period_us: u64,
    /// The ratio was learned from a period since the clock (re)started;
    /// until then the first period's ratio is taken whole.
    ratio_learned: bool,
    /// `CLOCK_MONOTONIC` ns since which `charged_ns` and `measured_ns` were
    /// gathered (the query that last moved the clock).
    gathered_since: u64,
}

/// Per-process corrections from NVML.
pub(super) struct Usage {
    samplers: Mutex<[Sampler; MAX_DEVICES]>,
    /// `CLOCK_MONOTONIC` ns of each device's next sample.
    due: [AtomicU64; MAX_DEVICES],
    /// Set when launches ran without the limit (the device was exclusive):
    /// the next sample starts afresh, not charging that time.
    restart: [AtomicBool; MAX_DEVICES],
    /// GPU time per measured time of the last period, parts per million
    /// (1,000,000 until a sample says otherwise).
    ratio_ppm: [AtomicU64; MAX_DEVICES],
    /// Whether the fallback was logged.
    logged: AtomicBool,
}

impl Usage {
    pub(super) fn new() -> Self {
        Self {
            samplers: Mutex::new(std::array::from_fn(|_| Sampler::default())),
            due: std::array::from_fn(|_| AtomicU64::new(0)),
            restart: std::array::from_fn(|_| AtomicBool::new(false)),
            ratio_ppm: std::array::from_fn(|_| AtomicU64::new(PPM)),
            logged: AtomicBool::new(false),
        }
    }

    fn samplers(&self) -> std::sync::MutexGuard<'_, [Sampler; MAX_DEVICES]> {
        self.samplers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a launch on `dev` measured at `ns` is charged until the next
    /// sample: `ns` scaled by the last period's ratio of GPU time to
    /// measured time.
    pub(super) fn scale(&self, dev: usize, ns: u64) -> u64 {
        let ratio = self
            .ratio_ppm
            .get(dev)
            .map_or(PPM, |r| r.load(Ordering::Relaxed));
        u64::try_from(u128::from(ns) * u128::from(ratio) / u128::from(PPM)).unwrap_or(u64::MAX)
    }

    /// A settled launch on `dev` measured `measured` ns and was charged
    /// `charged`.
    pub(super) fn settled(&self, dev: usize, measured: u64, charged: u64) {
        if let Some(s) = self.samplers().get_mut(dev) {
            s.measured_ns = s.measured_ns.saturating_add(measured);
            s.charged_ns = s.charged_ns.saturating_add(charged);
        }
    }

    /// What the process learned of `dev` is stale: a launch ran without the
    /// limit (its time is not the budget's), or the node agent held the
    /// container back (the ratio of GPU time to measured time came from
    /// before, perhaps from queueing behind the holder). The next sample
    /// starts the clock afresh and the ratio at 1.
    pub(super) fn restart(&self, dev: usize) {
        if let Some(flag) = self.restart.get(dev) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Corrects `dev`'s budget from NVML if a sample is due (one load when
    /// it is not). The driver is asked without the lock held.
    pub(super) fn sample(&self, region: &Region, slot: Option<SlotId>, dev: usize, now: u64) {
        let Some(due) = self.due.get(dev) else {
            return;
        };
        let next = due.load(Ordering::Relaxed);
        if now < next
            || due
                .compare_exchange(next, now + SAMPLE_NS, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // A process that launched nothing for a while starts the clock
        // afresh: its first sample would otherwise span the idle time.
        let idle = now > next.saturating_add(IDLE_NS);
        let restart = self.restart[dev].swap(false, Ordering::Relaxed) || idle;
        let (last_seen, charged, measured, gathered_since) = {
            let mut samplers = self.samplers();
            let s = &mut samplers[dev];
            if s.off {
                return;
            }
            if restart {
                // The first sample after now starts the clock: the one
                // before may hold time the limit did not apply to.
                s.last_seen_us = realtime_us();
                s.starting = true;
                s.ratio_learned = false;
                self.ratio_ppm[dev].store(PPM, Ordering::Relaxed);
            }
            (
                s.last_seen_us,
                std::mem::take(&mut s.charged_ns),
                std::mem::take(&mut s.measured_ns),
                s.gathered_since,
            )
        };
        let answer = self.own_time(region, slot, dev, last_seen);
        log!(
            DEBUG,
            "device {dev}: NVML since {last_seen} us: {answer:?}; charged {charged} ns, measured {measured} ns, ratio {} ppm",
            self.ratio_ppm[dev].load(Ordering::Relaxed)
        );
        let mut samplers = self.samplers();
        let s = &mut samplers[dev];
        if let Ok(Some((_, newest))) = answer
            && !s.starting
            && newest > last_seen + MIN_PERIOD_US
        {
            let gap = newest - last_seen;
            s.period_us = if s.period_us == 0 {
                gap
            } else {
                s.period_us.min(gap)
            };
        }
        // Ask next just after the next sample is due, so each correction
        // lags its sample by the same time and consecutive mismatches cancel.
        let wait = match answer {
            Ok(Some((_, newest))) if s.period_us != 0 => {
                let due_us = newest + s.period_us + SLACK_US;
                (due_us.saturating_sub(realtime_us()) * 1000).clamp(RETRY_NS / 2, 2 * SAMPLE_NS)
            }
            Ok(None) if s.period_us != 0 => RETRY_NS,
            _ => SAMPLE_NS,
        };
        due.store(now.saturating_add(wait), Ordering::Relaxed);
        match answer {
            Err(why) => {
                s.off = true;
                self.ratio_ppm[dev].store(PPM, Ordering::Relaxed);
                if !self.logged.swap(true, Ordering::Relaxed) {
                    log!(
                        INFO,
                        "device {dev}: no per-process utilisation ({why}); launches are charged their measured time, including time queued behind other processes"
                    );
                }
            }
            // The first sample after a (re)start only starts the clock:
            // launches before it keep their measured charge.
            Ok(Some((_, newest))) if s.starting => {
                s.last_seen_us = newest;
                s.starting = false;
                s.gathered_since = now;
            }
            Ok(None) if s.starting => {}
            // No sample newer than the last one yet (a real GPU samples
            // about every 200 ms): these charges wait for the sample that
            // covers them, and the clock stays at the last sample's time.
            Ok(None) => {
                s.charged_ns = s.charged_ns.saturating_add(charged);
                s.measured_ns = s.measured_ns.saturating_add(measured);
            }
            Ok(Some((own_ns, newest))) => {
                s.last_seen_us = newest;
                s.gathered_since = now;
                let correction = own_ns as i64 - charged as i64;
                region.charge(dev, correction);
                region.adjust_busy(dev, correction);
                let spans_agree = spans_agree(
                    now.saturating_sub(gathered_since) / 1000,
                    newest.saturating_sub(last_seen),
                );
                if measured >= MIN_MEASURED_NS && spans_agree {
                    // This period's ratio, within bounds, moves the old one
                    // (the first one after a restart is taken whole: the
                    // old one, 1, says nothing).
                    let ratio = (u128::from(own_ns) * u128::from(PPM) / u128::from(measured))
                        .clamp(u128::from(MIN_RATIO_PPM), u128::from(MAX_RATIO_PPM))
                        as u64;
                    let old = self.ratio_ppm[dev].load(Ordering::Relaxed);
                    let next = if s.ratio_learned {
                        next_ratio(old, ratio)
                    } else {
                        ratio
                    };
                    s.ratio_learned = true;
                    self.ratio_ppm[dev].store(next, Ordering::Relaxed);
                }
            }
        }
    }

    /// This process's GPU time on `dev` since `last_seen_us` (NVML's clock)
    /// and the newest sample's time; `None` when NVML has no sample newer
    /// than `last_seen_us`.
    fn own_time(
        &self,
        region: &Region,
        slot: Option<SlotId>,
        dev: usize,
        last_seen_us: u64,
    ) -> Result<Option<(u64, u64)>, String> {
        let pid = if in_host_pid_namespace() {
            std::process::id()
        } else {
            slot.and_then(|slot| region.host_pid(slot))
                .ok_or("this process's host pid is unknown")?
        };
        let device = crate::driver::devices::nvml_device(dev).ok_or("no NVML device for it")?;
        if crate::driver::nvml::nvml()
            .fns
            .nvmlDeviceGetProcessUtilization
            .is_none()
        {
            return Err("NVML has no nvmlDeviceGetProcessUtilization".into());
        }
        let mut samples = vec![nvmlProcessUtilizationSample_t::default(); 64];
        let rc = loop {
            let mut count = samples.len() as std::ffi::c_uint;
            let rc = real_nvml!(nvmlDeviceGetProcessUtilization(
                device,
                samples.as_mut_ptr(),
                &mut count,
                last_seen_us
            ));
            if rc == NVML_ERROR_INSUFFICIENT_SIZE && count as usize > samples.len() {
                samples.resize(count as usize + 16, Default::default());
                continue;
            }
            samples.truncate(count as usize);
            break rc;
        };
        match rc {
            NVML_SUCCESS if !samples.is_empty() => {
                Ok(Some(own_busy(&mut samples, pid, last_seen_us)))
            }
            NVML_SUCCESS | NVML_ERROR_NOT_FOUND => Ok(None),
            rc => Err(format!("nvmlDeviceGetProcessUtilization failed with {rc}")),
        }
    }
}

/// The ratio of GPU time to measured time for the next period, from the
/// last one's (`old`) and this period's (`seen`): a higher ratio (charge
/// more) is taken half at once, a lower one an eighth at a time.
fn next_ratio(old: u64, seen: u64) -> u64 {
    if seen >= old {
        old + (seen - old) / 2
    } else {
        old - (old - seen) / 8
    }
}

/// Whether launches gathered over `gathered_us` can be weighed against
/// samples covering `sampled_us`: within [`MAX_SPAN_SKEW_PERCENT`].
fn spans_agree(gathered_us: u64, sampled_us: u64) -> bool {
    gathered_us.abs_diff(sampled_us).saturating_mul(100)
        <= sampled_us.saturating_mul(MAX_SPAN_SKEW_PERCENT)
}

/// `pid`'s busy time in `samples` since `last_seen_us`: each sample's
/// `smUtil` % of the time since the previous one (the first: since
/// `last_seen_us`), in ns; and the newest sample's time.
fn own_busy(
    samples: &mut [nvmlProcessUtilizationSample_t],
    pid: u32,
    last_seen_us: u64,
) -> (u64, u64) {
    samples.sort_unstable_by_key(|s| s.time_stamp);
    let newest = samples.iter().map(|s| s.time_stamp).max().unwrap_or(0);
    if last_seen_us == 0 {
        // No period to measure against: the first sample only starts the clock.
        return (0, newest);
    }
    let mut previous = last_seen_us;
    let mut busy_ns = 0u64;
    for s in samples.iter().filter(|s| s.pid == pid) {
        let span_us = s.time_stamp.saturating_sub(previous);
        let ns = u128::from(span_us) * 10 * u128::from(s.sm_util.min(100));
        busy_ns = busy_ns.saturating_add(u64::try_from(ns).unwrap_or(u64::MAX));
        previous = previous.max(s.time_stamp);
    }
    (busy_ns, newest.max(last_seen_us))
}

/// `CLOCK_REALTIME` in µs, NVML's sample clock.
fn realtime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, time_stamp: u64, sm_util: u32) -> nvmlProcessUtilizationSample_t {
        nvmlProcessUtilizationSample_t {
            pid,
            time_stamp,
            sm_util,
            ..Default::default()
        }
    }

    #[test]
    fn the_ratio_rises_fast_and_falls_slowly() {
        // Charging more is safe at once; charging less is learned slowly, so
        // a period starved behind a neighbour's burst (its measured time all
        // queueing) does not let the next one burst in turn.
        assert_eq!(next_ratio(400_000, 800_000), 600_000);
        assert_eq!(next_ratio(800_000, 0), 700_000);
        let mut ratio = PPM;
        for _ in 0..8 {
            ratio = next_ratio(ratio, MIN_RATIO_PPM);
        }
        assert!(ratio > 3 * PPM / 10, "{ratio}");
        assert_eq!(next_ratio(PPM, PPM), PPM);
    }

    #[test]
    fn a_ratio_is_learned_only_from_spans_that_agree() {
        assert!(spans_agree(200_000, 200_000));
        assert!(spans_agree(215_000, 200_000));
        assert!(spans_agree(185_000, 200_000));
        // The query after the period is learned comes early.
        assert!(!spans_agree(133_000, 200_000));
        assert!(!spans_agree(400_000, 200_000));
        assert!(!spans_agree(1, 0));
        assert!(spans_agree(0, 0));
        assert!(spans_agree(u64::MAX, u64::MAX));
    }

    #[test]
    fn own_busy_time_is_each_sample_s_share_of_its_period() {
        // 30 % of 100 ms, then 50 % of the next 50 ms; pid 9 is another's.
        let mut samples = [
            sample(7, 1_150_000, 50),
            sample(9, 1_200_000, 90),
            sample(7, 1_100_000, 30),
        ];
        assert_eq!(
            own_busy(&mut samples, 7, 1_000_000),
            (30_000_000 + 25_000_000, 1_200_000)
        );
        // Nothing of ours: no time, but the clock moves on.
        assert_eq!(own_busy(&mut samples, 8, 1_000_000), (0, 1_200_000));
        assert_eq!(own_busy(&mut [], 7, 5), (0, 5));
        // Before the first sample there is no period: nothing, no overflow.
        assert_eq!(own_busy(&mut samples, 7, 0), (0, 1_200_000));
        let mut far = [sample(7, u64::MAX, 100)];
        assert_eq!(own_busy(&mut far, 7, 1).1, u64::MAX);
    }
}
