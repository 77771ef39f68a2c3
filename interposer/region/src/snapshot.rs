//! A copy of a region's counters and live slots: from a mapping
//! ([`Region::snapshot`], the interposer and tests) or from bytes read out of
//! a file nobody trusts ([`Snapshot::parse`], the node agent through
//! [`crate::file::RegionFile`]).

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::region::{
    DeviceRecord, Error, Header, LIVE, Layout, MAGIC, MAX_DEVICES, Priority, REGION_SIZE, Region,
    Result, SLOTS, Sharing, SlotRecord, VERSION,
};

/// A consistent-enough copy of a region for metrics: each counter is read
/// atomically, the whole is not one atomic snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Every device the region accounts for, by CUDA ordinal.
    pub devices: Vec<DeviceUsage>,
    /// Every live process slot.
    pub processes: Vec<ProcessUsage>,
    /// The container's task priority.
    pub priority: Priority,
    /// The node agent's hold: the ordinals held (bit `i` = ordinal `i`) and
    /// until when (`CLOCK_MONOTONIC` ns); `None` when nothing is held.
    pub hold: Option<(u32, u64)>,
}

/// One device's limit and usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceUsage {
    /// CUDA ordinal inside the container.
    pub index: usize,
    /// Limit in bytes, `None` for no limit.
    pub limit: Option<u64>,
    /// Bytes held by all processes of the container.
    pub used: u64,
    /// Highest `used` seen since the region was created.
    pub peak: u64,
    /// Compute limit in percent, `None` for no limit.
    pub sm_limit: Option<u8>,
    /// Whether the node agent marked the device shared.
    pub sharing: Sharing,
    /// GPU time the container's limited launches took, in nanoseconds.
    pub busy_ns: u64,
    /// Time the container's launches waited for compute budget, ns.
    pub throttled_ns: u64,
}

/// One process's usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessUsage {
    /// The slot index.
    pub slot: usize,
    /// Pid inside the container.
    pub pid: u32,
    /// Start time in clock ticks since boot (guards against pid reuse).
    pub start_time: u64,
    /// Pid on the host, when the node agent has filled it in.
    pub host_pid: Option<u32>,
    /// Bytes held per device.
    pub used: [u64; MAX_DEVICES],
    /// Ordinals it has launched work on (bit `i` = ordinal `i`).
    pub active_devices: u32,
    /// When it last launched (`CLOCK_MONOTONIC` ns), `None` if never.
    pub active_at: Option<u64>,
}

impl Region {
    /// Copies the device counters and every live slot.
    pub fn snapshot(&self) -> Snapshot {
        let layout = self.layout();
        let devices = layout
            .devices
            .iter()
            .enumerate()
            .map(|(index, d)| {
                let limit = d.limit.load(Ordering::Relaxed);
                let sm = d.sm_limit.load(Ordering::Relaxed);
                DeviceUsage {
                    index,
                    limit: (limit != 0).then_some(limit),
                    used: d.used.load(Ordering::Acquire),
                    peak: d.peak.load(Ordering::Relaxed),
                    sm_limit: u8::try_from(sm).ok().filter(|&p| p != 0 && p < 100),
                    sharing: Sharing::from_raw(d.sharing.load(Ordering::Relaxed)),
                    busy_ns: d.busy_ns.load(Ordering::Relaxed),
                    throttled_ns: d.throttled_ns.load(Ordering::Relaxed),
                }
            })
            .collect();
        let processes = layout
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state.load(Ordering::Acquire) == LIVE)
            .map(|(slot, s)| {
                let host_pid = s.host_pid.load(Ordering::Relaxed);
                let active_at = s.active_at.load(Ordering::Relaxed);
                ProcessUsage {
                    slot,
                    pid: s.pid.load(Ordering::Relaxed),
                    start_time: s.start_time.load(Ordering::Relaxed),
                    host_pid: (host_pid != 0).then_some(host_pid),
                    used: std::array::from_fn(|d| s.used[d].load(Ordering::Relaxed)),
                    active_devices: s.active_devices.load(Ordering::Relaxed),
                    active_at: (active_at != 0).then_some(active_at),
                }
            })
            .collect();
        Snapshot {
            devices,
            processes,
            priority: self.priority(),
            hold: self.hold(),
        }
    }
}

/// Native-endian fields at fixed offsets of a region's bytes.
struct Bytes<'a>(&'a [u8; REGION_SIZE]);

impl Bytes<'_> {
    fn u32(&self, at: usize) -> u32 {
        let mut word = [0u8; 4];
        word.copy_from_slice(&self.0[at..at + 4]);
        u32::from_ne_bytes(word)
    }

    fn u64(&self, at: usize) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.0[at..at + 8]);
        u64::from_ne_bytes(word)
    }
}

const DEVICES: usize = offset_of!(Layout, devices);
const SLOT_TABLE: usize = offset_of!(Layout, slots);
const DEVICE_SIZE: usize = size_of::<DeviceRecord>();
const SLOT_SIZE: usize = size_of::<SlotRecord>();

impl Snapshot {
    /// Parses a region from its bytes, as read from a file anybody may have
    /// written: `bytes` must be exactly [`REGION_SIZE`] long, and the header
    /// must declare this crate's magic, version, size, device count, slot
    /// count and slot size (any minor version is read: later ones only use
    /// bytes that were reserved). Every offset and count is this crate's
    /// constant; nothing read from the bytes sizes anything, so any input
    /// either parses or is an error naming `path` and the rule, in time
    /// linear in [`REGION_SIZE`].
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let Ok(bytes) = <&[u8; REGION_SIZE]>::try_from(bytes) else {
            return Err(Error::Size {
                path: path.to_owned(),
                found: bytes.len() as u64,
            });
        };
        let b = Bytes(bytes);
        let magic = b.u64(offset_of!(Header, magic));
        if magic == 0 {
            return Err(Error::Uninitialised {
                path: path.to_owned(),
            });
        }
        if magic != MAGIC {
            return Err(Error::NotARegion {
                path: path.to_owned(),
                magic,
            });
        }
        let version = b.u32(offset_of!(Header, version));
        if version != VERSION {
            return Err(Error::Version {
                path: path.to_owned(),
                found: version,
            });
        }
        let fixed = [
            ("size", b.u64(offset_of!(Header, size)), REGION_SIZE as u64),
            (
                "device_count",
                u64::from(b.u32(offset_of!(Header, device_count))),
                MAX_DEVICES as u64,
            ),
            (
                "slot_count",
                u64::from(b.u32(offset_of!(Header, slot_count))),
                SLOTS as u64,
            ),
            (
                "slot_size",
                u64::from(b.u32(offset_of!(Header, slot_size))),
                SLOT_SIZE as u64,
            ),
        ];
        for (field, found, expected) in fixed {
            if found != expected {
                return Err(Error::Header {
                    path: path.to_owned(),
                    field,
                    found,
                    expected,
                });
            }
        }
        let devices = (0..MAX_DEVICES)
            .map(|index| {
                let at = DEVICES + index * DEVICE_SIZE;
                let limit = b.u64(at + offset_of!(DeviceRecord, limit));
                let sm = b.u32(at + offset_of!(DeviceRecord, sm_limit));
                DeviceUsage {
                    index,
                    limit: (limit != 0).then_some(limit),
                    used: b.u64(at + offset_of!(DeviceRecord, used)),
                    peak: b.u64(at + offset_of!(DeviceRecord, peak)),
                    sm_limit: u8::try_from(sm).ok().filter(|&p| p != 0 && p < 100),
                    sharing: Sharing::from_raw(b.u32(at + offset_of!(DeviceRecord, sharing))),
                    busy_ns: b.u64(at + offset_of!(DeviceRecord, busy_ns)),
                    throttled_ns: b.u64(at + offset_of!(DeviceRecord, throttled_ns)),
                }
            })
            .collect();
        let processes = (0..SLOTS)
            .map(|slot| (slot, SLOT_TABLE + slot * SLOT_SIZE))
            .filter(|&(_, at)| b.u32(at + offset_of!(SlotRecord, state)) == LIVE)
            .map(|(slot, at)| {
                let host_pid = b.u32(at + offset_of!(SlotRecord, host_pid));
                let active_at = b.u64(at + offset_of!(SlotRecord, active_at));
                let used = at + offset_of!(SlotRecord, used);
                ProcessUsage {
                    slot,
                    pid: b.u32(at + offset_of!(SlotRecord, pid)),
                    start_time: b.u64(at + offset_of!(SlotRecord, start_time)),
                    host_pid: (host_pid != 0).then_some(host_pid),
                    used: std::array::from_fn(|d| b.u64(used + d * 8)),
                    active_devices: b.u32(at + offset_of!(SlotRecord, active_devices)),
                    active_at: (active_at != 0).then_some(active_at),
                }
            })
            .collect();
        let held = b.u32(offset_of!(Header, held_devices));
        Ok(Snapshot {
            devices,
            processes,
            priority: Priority::from_raw(b.u32(offset_of!(Header, priority))),
            hold: (held != 0).then(|| (held, b.u64(offset_of!(Header, hold_until)))),
        })
    }

    /// Whether a live process launched on ordinal `dev` at or after `since`
    /// (what [`Region::launched_since`] answers from the mapping).
    pub fn launched_since(&self, dev: usize, since: u64) -> bool {
        let Some(bit) = u32::try_from(dev)
            .ok()
            .filter(|&d| (d as usize) < MAX_DEVICES)
            .map(|d| 1u32 << d)
        else {
            return false;
        };
        self.processes
            .iter()
            .any(|p| p.active_devices & bit != 0 && p.active_at.is_some_and(|at| at >= since))
    }
}
