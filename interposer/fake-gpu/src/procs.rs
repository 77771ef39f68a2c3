//! Per-process accounting of the fake devices, for the fake NVML's process
//! queries (`nvmlDeviceGetComputeRunningProcesses*`,
//! `nvmlDeviceGetProcessUtilization`), written by the fake driver.
//!
//! A second file beside the device state (`$FAKE_CUDA_STATE.procs`, or
//! private memory when that is unset) holds, per device:
//!
//! - a table of [`PROCS`] processes: pid and the device memory it holds
//!   (a process enters it with its first allocation or launch on the device);
//! - a ring of the last [`RUNS`] runs of work on the device's timeline: pid,
//!   start and end (`CLOCK_MONOTONIC` ns). Back-to-back runs of one process
//!   are merged, so the ring covers seconds of work even with short kernels.
//!
//! Layout (native endianness): `magic: u64` ("FAKEPRC1", written last), then
//! 16 devices of `{ lock, runs_written, [PROCS × { pid: u32, pad: u32, used:
//! u64 }], [RUNS × { pid, start, end: u64 }] }`.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"FAKEPRC1");
const MAX_DEVICES: usize = 16;
/// Processes tracked per device.
pub const PROCS: usize = 64;
/// Runs of work kept per device.
pub const RUNS: usize = 4096;

#[repr(C)]
struct Proc {
    pid: AtomicU32,
    padding: AtomicU32,
    used: AtomicU64,
}

#[repr(C)]
struct Run {
    pid: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
}

#[repr(C)]
struct Device {
    /// A spin lock (0 free, 1 held) over the runs.
    lock: AtomicU64,
    /// Runs ever written; the next goes to `runs_written % RUNS`.
    runs_written: AtomicU64,
    procs: [Proc; PROCS],
    runs: [Run; RUNS],
}

impl Device {
    /// Takes the spin lock over the runs.
    fn lock_runs(&self) {
        while self
            .lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    /// Releases the spin lock `lock_runs` took.
    fn unlock_runs(&self) {
        self.lock.store(0, Ordering::Release);
    }
}

#[repr(C)]
struct Layout {
    magic: AtomicU64,
    devices: [Device; MAX_DEVICES],
}

/// The mapped accounting.
pub struct Procs {
    map: NonNull<Layout>,
}

// SAFETY: the mapping holds only atomics and lives for the process (never unmapped).
unsafe impl Send for Procs {}
// SAFETY: as above; all access through `&Procs` is atomic.
unsafe impl Sync for Procs {}

static PROCS_MAP: OnceLock<Option<Procs>> = OnceLock::new();

/// The accounting, mapped on first use; `None` if it cannot be (the fakes
/// then report no processes).
pub fn procs() -> Option<&'static Procs> {
    PROCS_MAP
        .get_or_init(|| match Procs::map() {
            Ok(procs) => Some(procs),
            Err(message) => {
                eprintln!("fake CUDA process accounting: {message}");
                None
            }
        })
        .as_ref()
}

/// This process's pid, cached (a `pthread_atfork` handler forgets it in a
/// child), so that a launch pays no system call for it.
fn own_pid() -> u32 {
    static PID: AtomicU32 = AtomicU32::new(0);
    extern "C" fn forked() {
        PID.store(0, Ordering::Relaxed);
    }
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(forked)) };
    });
    let pid = std::process::id();
    PID.store(pid, Ordering::Relaxed);
    pid
}

impl Procs {
    fn map() -> Result<Self, String> {
        let size = size_of::<Layout>();
        let file = match std::env::var_os("FAKE_CUDA_STATE") {
            Some(state) => {
                let mut path = state;
                path.push(".procs");
                // Locked until released below (or until it closes).
                Some(crate::file::open_locked(&path, size)?)
            }
            None => None,
        };
        let map = crate::file::map_shared(file.as_ref(), size)?;
        let procs = Self { map };
        // A fresh file is all zeroes, which is the initial state.
        procs.layout().magic.store(MAGIC, Ordering::Release);
        if let Some(file) = &file {
            // SAFETY: unlocking a descriptor `file` owns.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
        Ok(procs)
    }

    fn layout(&self) -> &Layout {
        // SAFETY: `map` points to a live mapping of a `Layout`, made only of
        // atomics (any bit pattern is valid) and never unmapped.
        unsafe { self.map.as_ref() }
    }

    fn device(&self, dev: usize) -> Option<&Device> {
        self.layout().devices.get(dev)
    }

    /// This process's entry on `dev`, claimed if it has none (reusing the
    /// entry of a dead process when the table is full).
    fn own(&self, dev: usize) -> Option<&Proc> {
        let device = self.device(dev)?;
        let pid = own_pid();
        if let Some(p) = device
            .procs
            .iter()
            .find(|p| p.pid.load(Ordering::Acquire) == pid)
        {
            return Some(p);
        }
        for dead_too in [false, true] {
            for p in &device.procs {
                let current = p.pid.load(Ordering::Acquire);
                let free = current == 0 || (dead_too && !alive(current));
                if free
                    && p.pid
                        .compare_exchange(current, pid, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    p.used.store(0, Ordering::Relaxed);
                    // Another thread of this process may have claimed one
                    // too: the first entry with our pid is ours.
                    let first = device
                        .procs
                        .iter()
                        .find(|q| q.pid.load(Ordering::Acquire) == pid)?;
                    if !std::ptr::eq(first, p) {
                        p.pid.store(0, Ordering::Release);
                    }
                    return Some(first);
                }
            }
        }
        None
    }

    /// This process took (`delta > 0`) or gave back device memory on `dev`.
    pub fn memory(&self, dev: usize, delta: i64) {
        if let Some(p) = self.own(dev) {
            let _ = p
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                    Some(used.saturating_add_signed(delta))
                });
        }
    }

    /// This process's work ran on `dev` from `start` to `end`.
    pub fn ran(&self, dev: usize, start: u64, end: u64) {
        let Some(device) = self.device(dev) else {
            return;
        };
        if end <= start || self.own(dev).is_none() {
            return;
        }
        let pid = u64::from(own_pid());
        device.lock_runs();
        let written = device.runs_written.load(Ordering::Relaxed);
        let last = written
            .checked_sub(1)
            .map(|i| &device.runs[(i % RUNS as u64) as usize]);
        match last {
            Some(run)
                if run.pid.load(Ordering::Relaxed) == pid
                    && run.end.load(Ordering::Relaxed) == start =>
            {
                run.end.store(end, Ordering::Relaxed);
            }
            _ => {
                let run = &device.runs[(written % RUNS as u64) as usize];
                run.pid.store(pid, Ordering::Relaxed);
                run.start.store(start, Ordering::Relaxed);
                run.end.store(end, Ordering::Relaxed);
                device.runs_written.store(written + 1, Ordering::Relaxed);
            }
        }
        device.unlock_runs();
    }

    /// The live processes on `dev` and the memory each holds.
    pub fn processes(&self, dev: usize) -> Vec<(u32, u64)> {
        let Some(device) = self.device(dev) else {
            return Vec::new();
        };
        device
            .procs
            .iter()
            .map(|p| {
                (
                    p.pid.load(Ordering::Acquire),
                    p.used.load(Ordering::Relaxed),
                )
            })
            .filter(|&(pid, _)| pid != 0 && alive(pid))
            .collect()
    }

    /// How long each process's work ran on `dev` between `from` and `to`
    /// (`CLOCK_MONOTONIC` ns), as far back as the ring reaches; processes
    /// whose work did not run then are left out.
    pub fn busy(&self, dev: usize, from: u64, to: u64) -> Vec<(u32, u64)> {
        let Some(device) = self.device(dev) else {
            return Vec::new();
        };
        device.lock_runs();
        let written = device.runs_written.load(Ordering::Relaxed);
        let mut busy: Vec<(u32, u64)> = Vec::new();
        for i in written.saturating_sub(RUNS as u64)..written {
            let run = &device.runs[(i % RUNS as u64) as usize];
            let start = run.start.load(Ordering::Relaxed).max(from);
            let end = run.end.load(Ordering::Relaxed).min(to);
            if end <= start {
                continue;
            }
            let pid = run.pid.load(Ordering::Relaxed) as u32;
            match busy.iter_mut().find(|(p, _)| *p == pid) {
                Some((_, ns)) => *ns += end - start,
                None => busy.push((pid, end - start)),
            }
        }
        device.unlock_runs();
        busy
    }
}

/// Whether `pid` exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    if unsafe { libc::kill(raw, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().as_bytes().first()),
            Some(Some(b'Z' | b'X'))
        ),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_merged_and_counted_per_process_in_a_window() {
        // Private memory: FAKE_CUDA_STATE is not set for unit tests.
        let p = Procs::map().unwrap();
        let me = own_pid();
        p.ran(1, 1_000, 2_000);
        p.ran(1, 2_000, 2_500); // back to back: merged
        p.ran(1, 4_000, 5_000);
        assert_eq!(
            p.layout().devices[1].runs_written.load(Ordering::Relaxed),
            2
        );
        assert_eq!(p.busy(1, 0, 10_000), [(me, 2_500)]);
        assert_eq!(p.busy(1, 1_500, 4_500), [(me, 1_500)]);
        assert_eq!(p.busy(1, 2_500, 4_000), []);
        assert!(p.busy(2, 0, 10_000).is_empty());
        p.memory(1, 4 << 20);
        p.memory(1, -(1 << 20));
        assert_eq!(p.processes(1), [(me, 3 << 20)]);
        assert!(p.processes(0).is_empty());
    }

    #[test]
    fn the_ring_keeps_the_last_runs() {
        let p = Procs::map().unwrap();
        for i in 0..(RUNS as u64 + 10) {
            p.ran(3, i * 10, i * 10 + 5);
        }
        let total = p.busy(3, 0, u64::MAX);
        assert_eq!(total, [(own_pid(), RUNS as u64 * 5)]);
    }
}
