//! The safe reader: a copy of a region's counters and live slots.

use std::sync::atomic::Ordering;

use crate::{LIVE, MAX_DEVICES, Priority, Region, Sharing};

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
