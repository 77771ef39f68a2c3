//! What the container's processes really ran, from NVML's per-process
//! utilisation, to take out of the budget what events over-charge.
//!
//! The events around a launch measure the time from when it was enqueued
//! (its stream's earlier work done) to when it ended, which includes any
//! time it waited for the device while other processes' work ran. Where the
//! driver offers `nvmlDeviceGetProcessUtilization`, each process corrects its
//! own charges every [`SAMPLE_NS`]: it asks NVML how long its work occupied
//! the device since its previous sample (`smUtil` × the period, for its own
//! pid), and gives the budget back what its launches were charged beyond
//! that (or charges the difference, if NVML saw more: work launched outside
//! the hooks). Summed over samples the container is charged exactly its
//! processes' GPU time. Between samples a settled launch is charged its
//! measured time scaled by the ratio of GPU time to measured time of the
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
use crate::log::INFO;
use crate::sys::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_NOT_FOUND, NVML_SUCCESS,
    nvmlProcessUtilizationSample_t,
};

/// How often a process corrects its charges: often enough that a 1 s window
/// sees ten corrections, rarely enough for NVML's coarse sampling on a real
/// GPU (about six samples a second).
pub(super) const SAMPLE_NS: u64 = 100_000_000;

/// The unit of [`Usage::scale`]'s ratio.
const PPM: u64 = 1_000_000;
/// Bounds of the ratio: at least 5 % of the measured time is charged between
/// samples, at most twice it.
const MIN_RATIO_PPM: u64 = 50_000;
const MAX_RATIO_PPM: u64 = 2_000_000;
/// A period with less measured time than this leaves the ratio as it was.
const MIN_MEASURED_NS: u64 = 1_000_000;

/// One device's sampling state in this process.
#[derive(Default)]
struct Sampler {
    /// NVML's time (`CLOCK_REALTIME` µs) up to which this process's work was
    /// accounted; 0 before the first sample.
    last_seen_us: u64,
    /// GPU time this process's settled launches were charged since then, ns.
    charged_ns: u64,
    /// Their measured (event) time, ns.
    measured_ns: u64,
    /// NVML cannot tell this process's time on this device: do not ask again.
    off: bool,
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

    /// A launch on `dev` ran without the limit: its time is not the budget's.
    pub(super) fn unlimited(&self, dev: usize) {
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
        let restart = self.restart[dev].swap(false, Ordering::Relaxed);
        let (last_seen, charged, measured) = {
            let mut samplers = self.samplers();
            let s = &mut samplers[dev];
            if s.off {
                return;
            }
            if restart {
                s.last_seen_us = 0;
            }
            (
                s.last_seen_us,
                std::mem::take(&mut s.charged_ns),
                std::mem::take(&mut s.measured_ns),
            )
        };
        let asked_at = realtime_us();
        let answer = self.own_time(region, slot, dev, last_seen);
        let mut samplers = self.samplers();
        let s = &mut samplers[dev];
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
            // The first sample only starts the clock: launches before it
            // keep their measured charge.
            Ok(_) if last_seen == 0 => s.last_seen_us = asked_at,
            Ok((own_ns, seen_us)) => {
                s.last_seen_us = seen_us.max(asked_at);
                let correction = own_ns as i64 - charged as i64;
                region.charge(dev, correction);
                region.adjust_busy(dev, correction);
                if measured >= MIN_MEASURED_NS {
                    // Half the old ratio and half this period's, within bounds.
                    let ratio = (u128::from(own_ns) * u128::from(PPM) / u128::from(measured))
                        .clamp(u128::from(MIN_RATIO_PPM), u128::from(MAX_RATIO_PPM))
                        as u64;
                    let old = self.ratio_ppm[dev].load(Ordering::Relaxed);
                    self.ratio_ppm[dev].store((old + ratio) / 2, Ordering::Relaxed);
                }
            }
        }
    }

    /// This process's GPU time on `dev` since `last_seen_us` (NVML's clock),
    /// and the newest sample's time.
    fn own_time(
        &self,
        region: &Region,
        slot: Option<SlotId>,
        dev: usize,
        last_seen_us: u64,
    ) -> Result<(u64, u64), String> {
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
            NVML_SUCCESS => Ok(own_busy(&mut samples, pid, last_seen_us)),
            NVML_ERROR_NOT_FOUND => Ok((0, last_seen_us)),
            rc => Err(format!("nvmlDeviceGetProcessUtilization failed with {rc}")),
        }
    }
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
