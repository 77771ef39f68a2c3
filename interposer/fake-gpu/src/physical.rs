//! The fake devices' physical memory, in a file every process maps.
//!
//! Layout (native endianness): `magic: u64` ("FAKECUD2", written last),
//! `device_count: u32`, 4 bytes padding, then 16 devices of
//! `{ total, used, peak, reserved, lock, free_at, enqueued_ns, launches }`
//! as `u64`s.
//!
//! The timeline: a device runs one piece of work at a time, in the order it
//! was enqueued by any process. Work enqueued at `now` starts at
//! `max(now, free_at)` and ends `duration` later, so the device is busy
//! without a gap from `now` to `free_at`, and the busy time up to `now` is
//! `enqueued_ns - (free_at - now)`: exact, and independent of how fast the
//! host runs.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"FAKECUD2");
const MAX_DEVICES: usize = 16;

#[repr(C)]
struct Device {
    total: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    reserved: AtomicU64,
    /// A spin lock (0 free, 1 held) over the timeline fields below.
    lock: AtomicU64,
    /// `CLOCK_MONOTONIC` ns at which the last enqueued work ends.
    free_at: AtomicU64,
    /// Total duration of all work ever enqueued, ns.
    enqueued_ns: AtomicU64,
    /// Launches ever enqueued.
    launches: AtomicU64,
    /// When the first launch was enqueued, ns.
    first_launch: AtomicU64,
}

#[repr(C)]
struct Layout {
    magic: AtomicU64,
    device_count: AtomicU32,
    padding: AtomicU32,
    devices: [Device; MAX_DEVICES],
}

/// The mapped device state.
pub struct Physical {
    map: NonNull<Layout>,
}

// SAFETY: the mapping holds only atomics and lives for the process (never unmapped).
unsafe impl Send for Physical {}
// SAFETY: as above; all access through `&Physical` is atomic.
unsafe impl Sync for Physical {}

impl Physical {
    /// Maps the state named by `FAKE_CUDA_STATE` (or private memory),
    /// initialising it from the environment if this process is first.
    pub fn from_env() -> Result<Self, String> {
        let count = match std::env::var("FAKE_CUDA_DEVICE_COUNT") {
            Ok(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_DEVICES as u32).contains(n))
                .ok_or_else(|| format!("FAKE_CUDA_DEVICE_COUNT={v:?}: must be 1 to 16"))?,
            Err(_) => 1,
        };
        let memory = match std::env::var("FAKE_CUDA_DEVICE_MEMORY") {
            Ok(v) => parse_bytes(&v).ok_or_else(|| {
                format!("FAKE_CUDA_DEVICE_MEMORY={v:?}: must be bytes with an optional k, m or g")
            })?,
            Err(_) => 80 << 30,
        };
        let size = size_of::<Layout>();
        let file = match std::env::var_os("FAKE_CUDA_STATE") {
            Some(path) => Some(crate::file::open_locked(&path, size)?),
            None => None,
        };
        let map = crate::file::map_shared(file.as_ref(), size)?;
        let physical = Self { map };
        let layout = physical.layout();
        if layout.magic.load(Ordering::Acquire) != MAGIC {
            layout.device_count.store(count, Ordering::Relaxed);
            for device in &layout.devices[..count as usize] {
                device.total.store(memory, Ordering::Relaxed);
            }
            layout.magic.store(MAGIC, Ordering::Release);
        }
        if let Some(file) = &file {
            // Explicitly: the mapping keeps the open file description, and
            // with it the lock, alive after the descriptor is closed.
            // SAFETY: unlocking a descriptor `file` owns.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
        Ok(physical)
    }

    fn layout(&self) -> &Layout {
        // SAFETY: `map` points to a live mapping of a `Layout`, made only of
        // atomics (any bit pattern is valid) and never unmapped.
        unsafe { self.map.as_ref() }
    }

    /// How many devices there are (`FAKE_CUDA_DEVICE_COUNT` of the first process).
    pub fn device_count(&self) -> usize {
        self.layout().device_count.load(Ordering::Relaxed) as usize
    }

    /// Device `dev`'s memory, bytes.
    pub fn total(&self, dev: usize) -> u64 {
        self.layout().devices[dev].total.load(Ordering::Relaxed)
    }

    /// Bytes of device `dev` taken, by every process.
    pub fn used(&self, dev: usize) -> u64 {
        self.layout().devices[dev].used.load(Ordering::Acquire)
    }

    /// The most bytes of device `dev` ever taken at once.
    pub fn peak(&self, dev: usize) -> u64 {
        self.layout().devices[dev].peak.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of device `dev` if they are free.
    pub fn reserve(&self, dev: usize, bytes: u64) -> bool {
        let device = &self.layout().devices[dev];
        let total = device.total.load(Ordering::Relaxed);
        let taken = device
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&n| n <= total)
            });
        match taken {
            Ok(before) => {
                device.peak.fetch_max(before + bytes, Ordering::Relaxed);
                if let Some(procs) = crate::procs::procs() {
                    procs.memory(dev, bytes as i64);
                }
                true
            }
            Err(_) => false,
        }
    }

    fn locked<T>(&self, dev: usize, body: impl FnOnce(&Device) -> T) -> T {
        let device = &self.layout().devices[dev];
        while device
            .lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        let result = body(device);
        device.lock.store(0, Ordering::Release);
        result
    }

    /// Enqueues `duration` ns of work on device `dev` at `now`; returns when
    /// it ends.
    pub fn enqueue(&self, dev: usize, now: u64, duration: u64) -> u64 {
        let end = self.locked(dev, |d| {
            let _ = d
                .first_launch
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
            let start = now.max(d.free_at.load(Ordering::Relaxed));
            let end = start + duration;
            d.free_at.store(end, Ordering::Relaxed);
            d.enqueued_ns.fetch_add(duration, Ordering::Relaxed);
            d.launches.fetch_add(1, Ordering::Relaxed);
            end
        });
        // Which process's work ran when, for the fake NVML.
        if let Some(procs) = crate::procs::procs() {
            procs.ran(dev, end - duration, end);
        }
        end
    }

    /// Nanoseconds device `dev` has been busy up to `now`, and its launches.
    pub fn busy(&self, dev: usize, now: u64) -> (u64, u64) {
        self.locked(dev, |d| {
            let ahead = d.free_at.load(Ordering::Relaxed).saturating_sub(now);
            (
                d.enqueued_ns.load(Ordering::Relaxed).saturating_sub(ahead),
                d.launches.load(Ordering::Relaxed),
            )
        })
    }

    /// When the first launch on device `dev` was enqueued (0: none yet).
    pub fn first_launch(&self, dev: usize) -> u64 {
        self.layout().devices[dev]
            .first_launch
            .load(Ordering::Relaxed)
    }

    /// Gives back `bytes` of device `dev`.
    pub fn release(&self, dev: usize, bytes: u64) {
        if let Some(procs) = crate::procs::procs() {
            procs.memory(dev, -(bytes as i64));
        }
        let _ = self.layout().devices[dev].used.fetch_update(
            Ordering::AcqRel,
            Ordering::Relaxed,
            |used| Some(used.saturating_sub(bytes)),
        );
    }
}

/// Bytes with an optional `k`, `m` or `g` suffix (`80g`); `None` when
/// malformed or 0.
pub fn parse_bytes(value: &str) -> Option<u64> {
    let (digits, shift) = match value.as_bytes().last()? {
        b'k' | b'K' => (&value[..value.len() - 1], 10),
        b'm' | b'M' => (&value[..value.len() - 1], 20),
        b'g' | b'G' => (&value[..value.len() - 1], 30),
        _ => (value, 0),
    };
    digits
        .parse::<u64>()
        .ok()?
        .checked_mul(1 << shift)
        .filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_serialises_work_and_counts_busy_time_exactly() {
        // Private memory: FAKE_CUDA_STATE is not set for unit tests.
        let p = Physical::from_env().unwrap();
        assert_eq!(p.busy(0, 1_000), (0, 0));
        assert_eq!(p.enqueue(0, 1_000, 500), 1_500);
        // Enqueued while the device is busy: it starts when the device is free.
        assert_eq!(p.enqueue(0, 1_200, 300), 1_800);
        assert_eq!(p.busy(0, 1_300).0, 300);
        assert_eq!(p.busy(0, 2_000).0, 800);
        // After a gap, work starts when it is enqueued; the gap is not busy.
        assert_eq!(p.enqueue(0, 3_000, 100), 3_100);
        assert_eq!(p.busy(0, 3_050).0, 850);
        assert_eq!(p.busy(0, 3_100), (900, 3));
        assert_eq!(p.first_launch(0), 1_000);
    }
}
