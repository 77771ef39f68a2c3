//! The fake devices' physical memory, in a file every process maps.
//!
//! Layout (native endianness): `magic: u64` ("FAKECUDA", written last),
//! `device_count: u32`, 4 bytes padding, then 16 devices of
//! `{ total, used, peak, reserved }` as `u64`s.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"FAKECUDA");
const MAX_DEVICES: usize = 16;

#[repr(C)]
struct Device {
    total: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    reserved: AtomicU64,
}

#[repr(C)]
struct Layout {
    magic: AtomicU64,
    device_count: AtomicU32,
    padding: AtomicU32,
    devices: [Device; MAX_DEVICES],
}

/// The mapped device state.
pub(crate) struct Physical {
    map: NonNull<Layout>,
}

// SAFETY: the mapping holds only atomics and lives for the process (never unmapped).
unsafe impl Send for Physical {}
// SAFETY: as above; all access through `&Physical` is atomic.
unsafe impl Sync for Physical {}

impl Physical {
    /// Maps the state named by `FAKE_CUDA_STATE` (or private memory),
    /// initialising it from the environment if this process is first.
    pub(crate) fn from_env() -> Result<Self, String> {
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
        let (fd, file) = match std::env::var_os("FAKE_CUDA_STATE") {
            Some(path) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o666)
                    .open(&path)
                    .map_err(|e| format!("cannot open {}: {e}", path.to_string_lossy()))?;
                // SAFETY: flock on a descriptor `file` owns; released when it closes.
                if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                    return Err(format!("cannot lock {}", path.to_string_lossy()));
                }
                if file.metadata().map_err(|e| e.to_string())?.len() < size as u64 {
                    file.set_len(size as u64).map_err(|e| e.to_string())?;
                }
                (file.as_raw_fd(), Some(file))
            }
            None => (-1, None),
        };
        let flags = if file.is_some() {
            libc::MAP_SHARED
        } else {
            libc::MAP_SHARED | libc::MAP_ANONYMOUS
        };
        // SAFETY: a fresh mapping of `size` bytes, of a file at least that
        // long or anonymous; it is never unmapped.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let map = NonNull::new(ptr.cast::<Layout>()).ok_or("mmap returned NULL")?;
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

    pub(crate) fn device_count(&self) -> usize {
        self.layout().device_count.load(Ordering::Relaxed) as usize
    }

    pub(crate) fn total(&self, dev: usize) -> u64 {
        self.layout().devices[dev].total.load(Ordering::Relaxed)
    }

    pub(crate) fn used(&self, dev: usize) -> u64 {
        self.layout().devices[dev].used.load(Ordering::Acquire)
    }

    pub(crate) fn peak(&self, dev: usize) -> u64 {
        self.layout().devices[dev].peak.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of device `dev` if they are free.
    pub(crate) fn reserve(&self, dev: usize, bytes: u64) -> bool {
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
                true
            }
            Err(_) => false,
        }
    }

    pub(crate) fn release(&self, dev: usize, bytes: u64) {
        let _ = self.layout().devices[dev].used.fetch_update(
            Ordering::AcqRel,
            Ordering::Relaxed,
            |used| Some(used.saturating_sub(bytes)),
        );
    }
}

fn parse_bytes(value: &str) -> Option<u64> {
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
