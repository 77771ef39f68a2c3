//! The mapped region: its layout, and [`Region`], through which the
//! processes of a container account in it (the node agent reads it through
//! [`RegionFile`](crate::file::RegionFile) instead, never mapping it).

use std::fs::{File, OpenOptions};
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// The first eight bytes of a region, `TSRVGPU1` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSRVGPU1");
/// The layout version this crate reads and writes.
pub const VERSION: u32 = 1;
/// The minor layout version: 1 added the compute fields of each device record
/// and 2 the task priority, the holds the node agent writes and each
/// process's latest launch, all in space that was reserved (zero) before, so
/// every reader reads every minor version's regions (a field a region lacks
/// reads as zero: no compute limit, low priority, no hold, no launch).
pub const MINOR_VERSION: u32 = 2;
/// Devices (CUDA ordinals) a region accounts for.
pub const MAX_DEVICES: usize = 16;
/// Process slots in a region: at most this many processes of one container
/// can use CUDA at the same time.
pub const SLOTS: usize = 1024;
/// Size in bytes of a region file.
pub const REGION_SIZE: usize = size_of::<Layout>();

/// Slot state: free to claim.
pub(crate) const FREE: u32 = 0;
/// Slot state: a process is filling it in.
pub(crate) const CLAIMING: u32 = 1;
/// Slot state: owned by a live process.
pub(crate) const LIVE: u32 = 2;
/// Slot state: its dead owner's usage is being returned.
pub(crate) const RECLAIMING: u32 = 3;

/// Everything that can go wrong with a region.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call on the region file failed.
    #[error("shared region {path}: cannot {op}")]
    Io {
        /// The region file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file does not start with [`MAGIC`].
    #[error("shared region {path}: not a Tessera region (magic {magic:#018x})")]
    NotARegion {
        /// The region file.
        path: PathBuf,
        /// The first eight bytes found.
        magic: u64,
    },
    /// The file has a layout version this crate does not know.
    #[error("shared region {path}: layout version {found}, expected {VERSION}")]
    Version {
        /// The region file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The file is smaller than a region or its header declares another size.
    #[error("shared region {path}: {found} bytes, expected {REGION_SIZE}")]
    Size {
        /// The region file.
        path: PathBuf,
        /// The size found.
        found: u64,
    },
    /// Every process slot is taken by a live process.
    #[error("shared region: all {SLOTS} process slots are in use by live processes")]
    SlotsFull,
    /// The region's name is not one path component.
    #[error("shared region {path}: the name must be one path component")]
    Name {
        /// The region file.
        path: PathBuf,
    },
    /// The path names something other than a regular file.
    #[error("shared region {path}: is a {kind}, not a regular file")]
    NotAFile {
        /// The region file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The file has other names (hard links).
    #[error("shared region {path}: has {links} links, a region has exactly one")]
    Links {
        /// The region file.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
    /// The file was replaced between its check and its opening.
    #[error("shared region {path}: replaced while being opened")]
    Replaced {
        /// The region file.
        path: PathBuf,
    },
    /// The file shrank while it was read.
    #[error("shared region {path}: read {read} of {REGION_SIZE} bytes (the file shrank)")]
    ShortRead {
        /// The region file.
        path: PathBuf,
        /// Bytes read before the end of the file.
        read: usize,
    },
    /// The file is all zeroes where the magic goes: created, not initialised.
    #[error("shared region {path}: not initialised (magic is 0)")]
    Uninitialised {
        /// The region file.
        path: PathBuf,
    },
    /// A header field is not the value this layout fixes.
    #[error("shared region {path}: header field {field} is {found}, expected {expected}")]
    Header {
        /// The region file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// Its value in the file.
        found: u64,
        /// The only value this crate accepts.
        expected: u64,
    },
    /// The region's limits or priority are not the ones the process's
    /// environment gives (the environment, set by the node agent from the
    /// allocation, is authoritative).
    #[error(
        "shared region {path}: holds other limits than this process's environment \
         (memory {found_memory:?}, compute {found_sm:?}, priority {found_priority:?}; \
         the environment says {memory:?}, {sm:?}, {priority:?})"
    )]
    LimitsDiffer {
        /// The region file.
        path: PathBuf,
        /// Memory limits in the region, bytes per device.
        found_memory: Box<[u64; MAX_DEVICES]>,
        /// Compute limits in the region, percent per device.
        found_sm: [u8; MAX_DEVICES],
        /// The region's priority.
        found_priority: Priority,
        /// Memory limits of the environment.
        memory: Box<[u64; MAX_DEVICES]>,
        /// Compute limits of the environment.
        sm: [u8; MAX_DEVICES],
        /// The environment's priority.
        priority: Priority,
    },
}

/// How the region's file is opened: no symbolic link followed at the last
/// component, no blocking on a FIFO, no controlling terminal, closed on exec.
pub(crate) const OPEN_FLAGS: libc::c_int =
    libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

impl Error {
    /// Whether the error is a region that does not exist yet or is being
    /// created (missing, empty, or all zeroes before its magic): what a
    /// container before its first CUDA call has, not an offence.
    pub fn is_pending(&self) -> bool {
        match self {
            Self::Io { source, .. } => source.kind() == io::ErrorKind::NotFound,
            Self::Size { found: 0, .. } | Self::Uninitialised { .. } => true,
            _ => false,
        }
    }

    /// For `map_err`: `op` on the file at `path` failed.
    pub(crate) fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> Self + 'a {
        move |source| Self::Io {
            path: path.to_owned(),
            op,
            source,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The region header (64 bytes at offset 0).
#[repr(C)]
pub(crate) struct Header {
    /// [`MAGIC`], stored last when the region is created (Release).
    pub(crate) magic: AtomicU64,
    /// [`VERSION`].
    pub(crate) version: AtomicU32,
    /// [`MAX_DEVICES`].
    pub(crate) device_count: AtomicU32,
    /// [`REGION_SIZE`].
    pub(crate) size: AtomicU64,
    /// [`SLOTS`].
    pub(crate) slot_count: AtomicU32,
    /// Size of one [`SlotRecord`].
    pub(crate) slot_size: AtomicU32,
    /// [`MINOR_VERSION`]: 0 for a region written before the compute fields
    /// existed (they read as zero: no compute limit), 1 before the priority
    /// fields, 2 since.
    pub(crate) minor_version: AtomicU32,
    /// `CUDA_TASK_PRIORITY` + 1 ([`Priority`]), written at creation; 0 in a
    /// region of minor version 0 or 1 (low priority).
    pub(crate) priority: AtomicU32,
    /// `CLOCK_MONOTONIC` ns until which the launches on `held_devices` wait,
    /// written by the node agent ([`holds`](crate::priority::holds), [`RegionFile::set_hold`](crate::file::RegionFile::set_hold)).
    pub(crate) hold_until: AtomicU64,
    /// Bit `i`: the node agent holds back launches on CUDA ordinal `i`
    /// (until `hold_until`), because a higher-priority container is active
    /// on its GPU.
    pub(crate) held_devices: AtomicU32,
    reserved0: AtomicU32,
    pub(crate) reserved: AtomicU64,
}

/// Per-device accounting (64 bytes each).
#[repr(C)]
pub(crate) struct DeviceRecord {
    /// Limit in bytes; 0 means no limit.
    pub(crate) limit: AtomicU64,
    /// Bytes reserved by all processes of the container (the CAS counter).
    pub(crate) used: AtomicU64,
    /// Highest value `used` ever reached.
    pub(crate) peak: AtomicU64,
    /// Compute limit in percent of the device's time; 0 means no limit.
    pub(crate) sm_limit: AtomicU32,
    /// Whether another container uses the device ([`Sharing`]), written by
    /// the node agent; 0 (unknown) until it does.
    pub(crate) sharing: AtomicU32,
    /// The container's compute budget in nanoseconds of GPU time (negative:
    /// in debt). Refilled at `sm_limit` % of wall time, charged by launches.
    pub(crate) tokens: AtomicI64,
    /// `CLOCK_MONOTONIC` nanoseconds up to which `tokens` has been refilled.
    pub(crate) refilled_at: AtomicU64,
    /// GPU time the container's limited launches were measured to take, ns.
    pub(crate) busy_ns: AtomicU64,
    /// Time launches of the container waited for budget, ns (summed over
    /// threads).
    pub(crate) throttled_ns: AtomicU64,
}

/// One process (192 bytes each).
#[repr(C)]
pub(crate) struct SlotRecord {
    /// `FREE`, `CLAIMING`, `LIVE` or `RECLAIMING`.
    pub(crate) state: AtomicU32,
    /// The owner's pid, as the container sees it.
    pub(crate) pid: AtomicU32,
    /// The owner's start time (field 22 of `/proc/<pid>/stat`, clock ticks since boot).
    pub(crate) start_time: AtomicU64,
    /// The owner's pid on the host, written by the node agent; 0 when unknown.
    pub(crate) host_pid: AtomicU32,
    /// Bit `i`: the process has launched work on CUDA ordinal `i`.
    pub(crate) active_devices: AtomicU32,
    /// Bytes this process holds per device.
    pub(crate) used: [AtomicU64; MAX_DEVICES],
    /// `CLOCK_MONOTONIC` ns of the process's latest launch (0: none).
    pub(crate) active_at: AtomicU64,
    pub(crate) reserved: [AtomicU64; 4],
}

#[repr(C)]
pub(crate) struct Layout {
    pub(crate) header: Header,
    pub(crate) devices: [DeviceRecord; MAX_DEVICES],
    pub(crate) slots: [SlotRecord; SLOTS],
}

const _: () = {
    assert!(size_of::<Header>() == 64);
    assert!(offset_of!(Header, minor_version) == 32);
    assert!(offset_of!(Header, priority) == 36);
    assert!(offset_of!(Header, hold_until) == 40);
    assert!(offset_of!(Header, held_devices) == 48);
    assert!(offset_of!(SlotRecord, active_devices) == 20);
    assert!(offset_of!(SlotRecord, active_at) == 152);
    assert!(offset_of!(DeviceRecord, sm_limit) == 24);
    assert!(offset_of!(DeviceRecord, sharing) == 28);
    assert!(offset_of!(DeviceRecord, tokens) == 32);
    assert!(offset_of!(DeviceRecord, refilled_at) == 40);
    assert!(offset_of!(DeviceRecord, busy_ns) == 48);
    assert!(offset_of!(DeviceRecord, throttled_ns) == 56);
    assert!(size_of::<DeviceRecord>() == 64);
    assert!(size_of::<SlotRecord>() == 192);
    assert!(offset_of!(Layout, devices) == 64);
    assert!(offset_of!(Layout, slots) == 1088);
    assert!(REGION_SIZE == 1088 + 192 * SLOTS);
};

/// The limits a region is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Memory limit per device in bytes, 0 for none.
    pub memory: [u64; MAX_DEVICES],
    /// Compute limit per device in percent (1 to 99), 0 for none.
    pub sm_percent: [u8; MAX_DEVICES],
    /// The container's task priority (`CUDA_TASK_PRIORITY`).
    pub priority: Priority,
}

/// Whether a device is shared with other containers, as the node agent
/// knows it from its allocations. `GPU_CORE_UTILIZATION_POLICY=default`
/// limits compute unless the device is [`Sharing::Exclusive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Nobody said (0): the agent has not written it; the limit applies.
    Unknown,
    /// Only this container uses the device (1).
    Exclusive,
    /// Other containers use it too (2).
    Shared,
}

impl Sharing {
    pub(crate) fn from_raw(raw: u32) -> Self {
        match raw {
            1 => Self::Exclusive,
            2 => Self::Shared,
            _ => Self::Unknown,
        }
    }

    pub(crate) fn raw(self) -> u32 {
        match self {
            Self::Unknown => 0,
            Self::Exclusive => 1,
            Self::Shared => 2,
        }
    }
}

/// A process slot claimed with [`Region::claim_slot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId(pub(crate) usize);

impl SlotId {
    /// The slot's index in the region.
    pub fn index(self) -> usize {
        self.0
    }

    /// The slot with this index, `None` beyond [`SLOTS`]. Slots are claimed
    /// with [`Region::claim_slot`]; this only rebuilds an id kept elsewhere.
    pub fn from_index(index: usize) -> Option<Self> {
        (index < SLOTS).then_some(Self(index))
    }
}

/// A reservation that would have exceeded the device's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes the container held when the reservation was refused.
    pub used: u64,
    /// The device's limit.
    pub limit: u64,
}

/// How [`Region::create_or_open`] found the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// This call created and initialised the region with the given limits.
    Created,
    /// The region existed; `limits_differ` is true when its limits are not the
    /// ones given (the region's limits stay in force).
    Attached {
        /// Whether the region holds other limits than the caller's.
        limits_differ: bool,
    },
}

/// What [`Region::reclaim_dead`] returned to the device counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Slots of dead processes that were freed.
    pub slots: usize,
    /// Bytes returned, summed over devices.
    pub bytes: u64,
}

/// A mapped region file.
pub struct Region {
    map: NonNull<Layout>,
}

// SAFETY: the mapping is only ever accessed through atomics (`&Layout` holds
// nothing else), and the pointer stays valid until `Drop` unmaps it.
unsafe impl Send for Region {}
// SAFETY: as above; every access through `&Region` is an atomic operation.
unsafe impl Sync for Region {}

impl Region {
    /// Opens the region at `path`, creating and initialising it with `limits`
    /// (bytes per device, 0 for none) when it does not exist yet.
    ///
    /// Creation is serialised with `flock`, so concurrent first users agree on
    /// one initialisation; the lock is held only here, never on the hot path.
    /// No device gets a compute limit; see [`Region::create_or_open_with`].
    pub fn create_or_open(path: &Path, limits: &[u64; MAX_DEVICES]) -> Result<(Self, Opened)> {
        Self::create_or_open_with(
            path,
            &Limits {
                memory: *limits,
                sm_percent: [0; MAX_DEVICES],
                priority: Priority::Low,
            },
        )
    }

    /// As [`Region::create_or_open`], with memory and compute limits.
    /// `limits_differ` compares both.
    pub fn create_or_open_with(path: &Path, limits: &Limits) -> Result<(Self, Opened)> {
        let io = |op| Error::io(path, op);
        // No symbolic link is followed at the last component, a FIFO or a
        // device node is refused before anything maps it, and a file of any
        // size but the region's (or 0, not created yet) is refused: a
        // process of the container attaches to nothing it cannot use.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .custom_flags(OPEN_FLAGS)
            .open(path)
            .map_err(io("open"))?;
        let _lock = FileLock::exclusive(&file).map_err(io("lock"))?;
        let metadata = file.metadata().map_err(io("stat"))?;
        check_type(path, &metadata)?;
        let len = metadata.len();
        if len == 0 {
            file.set_len(REGION_SIZE as u64).map_err(io("resize"))?;
            // Every process of the container must be able to map it, whatever
            // its user and umask (HAMi-core crashed on a region another user
            // had created).
            file.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(io("chmod"))?;
        } else if len != REGION_SIZE as u64 {
            return Err(Error::Size {
                path: path.to_owned(),
                found: len,
            });
        }
        let region = Self::map(&file).map_err(io("mmap"))?;
        let layout = region.layout();
        let magic = layout.header.magic.load(Ordering::Acquire);
        if magic == 0 {
            let header = &layout.header;
            header.version.store(VERSION, Ordering::Relaxed);
            header
                .device_count
                .store(MAX_DEVICES as u32, Ordering::Relaxed);
            header.size.store(REGION_SIZE as u64, Ordering::Relaxed);
            header.slot_count.store(SLOTS as u32, Ordering::Relaxed);
            header
                .slot_size
                .store(size_of::<SlotRecord>() as u32, Ordering::Relaxed);
            header.minor_version.store(MINOR_VERSION, Ordering::Relaxed);
            header
                .priority
                .store(limits.priority.raw(), Ordering::Relaxed);
            for (device, (&limit, &sm)) in layout
                .devices
                .iter()
                .zip(limits.memory.iter().zip(&limits.sm_percent))
            {
                device.limit.store(limit, Ordering::Relaxed);
                device.sm_limit.store(u32::from(sm), Ordering::Relaxed);
            }
            header.magic.store(MAGIC, Ordering::Release);
            return Ok((region, Opened::Created));
        }
        region.validate(path)?;
        let limits_differ = region.priority() != limits.priority
            || layout
                .devices
                .iter()
                .zip(limits.memory.iter().zip(&limits.sm_percent))
                .any(|(device, (&limit, &sm))| {
                    device.limit.load(Ordering::Relaxed) != limit
                        || device.sm_limit.load(Ordering::Relaxed) != u32::from(sm)
                });
        Ok((region, Opened::Attached { limits_differ }))
    }

    /// Opens an existing, initialised region and maps it: for a process of
    /// the container (and tests). Not for a reader outside the container:
    /// whoever can truncate the file can make any access to the mapping a
    /// `SIGBUS`; the node agent uses [`RegionFile`](crate::file::RegionFile), which never maps.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |op| Error::io(path, op);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(OPEN_FLAGS)
            .open(path)
            .map_err(io("open"))?;
        let metadata = file.metadata().map_err(io("stat"))?;
        check_type(path, &metadata)?;
        let len = metadata.len();
        if len != REGION_SIZE as u64 {
            return Err(Error::Size {
                path: path.to_owned(),
                found: len,
            });
        }
        let region = Self::map(&file).map_err(io("mmap"))?;
        region.validate(path)?;
        Ok(region)
    }

    fn map(file: &File) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of a file descriptor we own, of a
        // length the file has (checked by the callers); no existing memory is
        // affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(ptr.cast::<Layout>())
            .ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Self { map })
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let header = &self.layout().header;
        let magic = header.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(Error::NotARegion {
                path: path.to_owned(),
                magic,
            });
        }
        let version = header.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(Error::Version {
                path: path.to_owned(),
                found: version,
            });
        }
        let size = header.size.load(Ordering::Relaxed);
        if size != REGION_SIZE as u64
            || header.slot_count.load(Ordering::Relaxed) != SLOTS as u32
            || header.device_count.load(Ordering::Relaxed) != MAX_DEVICES as u32
        {
            return Err(Error::Size {
                path: path.to_owned(),
                found: size,
            });
        }
        Ok(())
    }

    pub(crate) fn layout(&self) -> &Layout {
        // SAFETY: `map` points to REGION_SIZE mapped bytes that live as long as
        // `self`; `Layout` is made only of atomics, for which every bit pattern
        // (including the zeroes of a fresh file) is valid, and which tolerate
        // concurrent writes by other processes.
        unsafe { self.map.as_ref() }
    }

    /// The limit of device `dev` in bytes, `None` for no limit or an ordinal
    /// beyond [`MAX_DEVICES`].
    pub fn limit(&self, dev: usize) -> Option<u64> {
        let limit = self
            .layout()
            .devices
            .get(dev)?
            .limit
            .load(Ordering::Relaxed);
        (limit != 0).then_some(limit)
    }

    /// Bytes all processes hold on device `dev` (0 beyond [`MAX_DEVICES`]).
    pub fn used(&self, dev: usize) -> u64 {
        self.layout()
            .devices
            .get(dev)
            .map_or(0, |d| d.used.load(Ordering::Acquire))
    }

    /// The limits the region holds (written by the process that created it).
    pub fn limits(&self) -> Limits {
        let devices = &self.layout().devices;
        Limits {
            memory: std::array::from_fn(|d| devices[d].limit.load(Ordering::Relaxed)),
            sm_percent: std::array::from_fn(|d| {
                u8::try_from(devices[d].sm_limit.load(Ordering::Relaxed)).unwrap_or(u8::MAX)
            }),
            priority: self.priority(),
        }
    }

    /// Records the host pid of a slot's process (the node agent knows it).
    pub fn set_host_pid(&self, slot: SlotId, host_pid: u32) {
        self.layout().slots[slot.0]
            .host_pid
            .store(host_pid, Ordering::Relaxed);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `map` was returned by mmap with REGION_SIZE and no reference
        // into it outlives `self`.
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), REGION_SIZE);
        }
    }
}

/// Refuses anything but a regular file (a directory, FIFO, socket or device
/// node where the region should be).
pub(crate) fn check_type(path: &Path, metadata: &std::fs::Metadata) -> Result<()> {
    if metadata.file_type().is_file() {
        return Ok(());
    }
    Err(Error::NotAFile {
        path: path.to_owned(),
        kind: if metadata.is_dir() {
            "directory"
        } else {
            "special file"
        },
    })
}

pub(crate) fn saturating_sub(counter: &AtomicU64, bytes: u64) {
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(bytes))
    });
}

/// An exclusive `flock` released on drop.
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn exclusive(file: &'a File) -> io::Result<Self> {
        loop {
            // SAFETY: flock on a descriptor owned by `file`, which outlives the lock.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Self(file));
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking the descriptor locked in `exclusive`, still open.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

/// `CUDA_TASK_PRIORITY`: 0 is high, 1 (the default) low; stored in the
/// region as the value + 1, so that 0 (a region older than minor version 2)
/// reads as low.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Priority {
    /// `CUDA_TASK_PRIORITY=0`: holds lower-priority containers back.
    High,
    /// `CUDA_TASK_PRIORITY=1`, or unset: held back while a high-priority
    /// container is active on the GPU.
    #[default]
    Low,
}

impl Priority {
    pub(crate) fn raw(self) -> u32 {
        match self {
            Self::High => 1,
            Self::Low => 2,
        }
    }

    pub(crate) fn from_raw(raw: u32) -> Self {
        if raw == 1 { Self::High } else { Self::Low }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
