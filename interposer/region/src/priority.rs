//! Task priority (`CUDA_TASK_PRIORITY`, HAMi's meaning): while a
//! high-priority container is active on a GPU, the launches of low-priority
//! containers on that GPU wait.
//!
//! No container sees another's region, so the decision is the node agent's,
//! which knows every container's region and which GPU each of their CUDA
//! ordinals is:
//!
//! 1. Every launch through the compute limiter records, in the process's
//!    slot, when it launched and on which ordinal ([`Region::record_launch`]).
//! 2. The agent calls [`arbitrate`] every period (e.g. 200 ms). For each GPU
//!    with a high-priority container that launched within `active_window`,
//!    it holds every low-priority container's ordinals on that GPU until
//!    `now + hold_for` ([`Region::set_hold`]), and releases the others.
//! 3. A low-priority container's limited launch on a held ordinal waits
//!    while the hold lasts ([`Region::held`]).
//!
//! Holds are deadlines, not flags: if the agent stops, they lapse after
//! `hold_for` and nothing stays blocked. A container is never held because
//! of its own activity, and containers of equal priority never hold each
//! other. Like HAMi's, the preemption is strict: a busy high-priority
//! container starves low-priority ones on its GPU. Times are
//! `CLOCK_MONOTONIC` nanoseconds, which the node's processes share (Kubernetes
//! containers do not get time namespaces).

use std::sync::atomic::Ordering;

use crate::region::{LIVE, MAX_DEVICES, Priority, Region, SlotId};

/// How recently a high-priority container must have launched on a GPU to
/// hold others back, as the node agent is advised to call [`arbitrate`].
pub const ACTIVE_WINDOW_NS: u64 = 500_000_000;
/// How long a hold lasts unless renewed (a few of the agent's periods).
pub const HOLD_NS: u64 = 1_000_000_000;

impl Region {
    /// The container's task priority.
    pub fn priority(&self) -> Priority {
        Priority::from_raw(self.layout().header.priority.load(Ordering::Relaxed))
    }

    /// Records that `slot`'s process launched on ordinal `dev` at `now`: one
    /// store to the process's own slot (and a read-modify-write only the
    /// first time on a device).
    pub fn record_launch(&self, slot: SlotId, dev: usize, now: u64) {
        let Some(bit) = device_bit(dev) else {
            return;
        };
        let s = &self.layout().slots[slot.0];
        s.active_at.store(now, Ordering::Relaxed);
        if s.active_devices.load(Ordering::Relaxed) & bit == 0 {
            s.active_devices.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Whether a live process of the container launched on ordinal `dev` at
    /// or after `since`.
    pub fn launched_since(&self, dev: usize, since: u64) -> bool {
        let Some(bit) = device_bit(dev) else {
            return false;
        };
        self.layout().slots.iter().any(|s| {
            s.state.load(Ordering::Acquire) == LIVE
                && s.active_devices.load(Ordering::Relaxed) & bit != 0
                && s.active_at.load(Ordering::Relaxed) >= since
        })
    }

    /// Whether launches on ordinal `dev` are held back at `now` (one or two
    /// relaxed loads).
    pub fn held(&self, dev: usize, now: u64) -> bool {
        let header = &self.layout().header;
        device_bit(dev).is_some_and(|bit| {
            header.held_devices.load(Ordering::Relaxed) & bit != 0
                && now < header.hold_until.load(Ordering::Relaxed)
        })
    }

    /// Holds back launches on the ordinals of `devices` (bit `i` = ordinal
    /// `i`) until `until`; `devices` 0 releases everything (the node agent).
    pub fn set_hold(&self, devices: u32, until: u64) {
        let header = &self.layout().header;
        // The deadline first, so that a newly held ordinal is never read
        // with an old, lapsed one.
        if devices != 0 {
            header.hold_until.store(until, Ordering::Relaxed);
        }
        header.held_devices.store(devices, Ordering::Relaxed);
    }

    /// The current hold: ordinals and deadline, `None` when nothing is held.
    pub fn hold(&self) -> Option<(u32, u64)> {
        let header = &self.layout().header;
        let devices = header.held_devices.load(Ordering::Relaxed);
        (devices != 0).then(|| (devices, header.hold_until.load(Ordering::Relaxed)))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of launch records and holds.
pub fn monotonic_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn device_bit(dev: usize) -> Option<u32> {
    (dev < MAX_DEVICES).then(|| 1u32 << dev)
}

/// One container on the node, as the node agent sees it: its region and the
/// GPU (any identifier, e.g. its UUID) behind each CUDA ordinal of the
/// container (index = ordinal; `None` for ordinals it does not have).
pub struct Member<'a, G> {
    /// The container's region.
    pub region: &'a Region,
    /// The GPU of each ordinal.
    pub gpus: Vec<Option<G>>,
}

/// What [`holds`] needs to know of a container's launches.
pub trait Launches {
    /// Whether a live process launched on ordinal `dev` at or after `since`.
    fn launched_since(&self, dev: usize, since: u64) -> bool;
}

impl Launches for Region {
    fn launched_since(&self, dev: usize, since: u64) -> bool {
        Region::launched_since(self, dev, since)
    }
}

impl Launches for crate::snapshot::Snapshot {
    fn launched_since(&self, dev: usize, since: u64) -> bool {
        crate::snapshot::Snapshot::launched_since(self, dev, since)
    }
}

/// One container for [`holds`]: its priority (the node agent takes it from
/// the container's allocation, never from the region the container can
/// write), its launches, and the GPU of each of its ordinals.
pub struct Contender<'a, G> {
    /// The container's priority.
    pub priority: Priority,
    /// Its launches (a region or a snapshot of one).
    pub launches: &'a dyn Launches,
    /// The GPU of each ordinal.
    pub gpus: &'a [Option<G>],
}

/// Decides the hold of every container at `now` (see the module docs): for
/// each, the ordinals to hold (bit `i` = ordinal `i`; always 0 for a
/// high-priority container). Writes nothing.
pub fn holds<G: PartialEq>(
    contenders: &[Contender<'_, G>],
    now: u64,
    active_window: u64,
) -> Vec<u32> {
    let since = now.saturating_sub(active_window);
    let mut active: Vec<(usize, &G)> = Vec::new();
    for (index, member) in contenders.iter().enumerate() {
        if member.priority != Priority::High {
            continue;
        }
        for (dev, gpu) in member.gpus.iter().enumerate().take(MAX_DEVICES) {
            if let Some(gpu) = gpu
                && member.launches.launched_since(dev, since)
            {
                active.push((index, gpu));
            }
        }
    }
    contenders
        .iter()
        .enumerate()
        .map(|(index, member)| {
            if member.priority == Priority::High {
                return 0;
            }
            let mut devices = 0u32;
            for (dev, gpu) in member.gpus.iter().enumerate().take(MAX_DEVICES) {
                if let Some(gpu) = gpu
                    && active.iter().any(|&(other, g)| other != index && g == gpu)
                {
                    devices |= 1 << dev;
                }
            }
            devices
        })
        .collect()
}

/// Decides the holds of every container at `now` (see the module docs) and
/// writes them; returns how many containers are held. Each container's
/// priority is the one in its region: for callers that trust the regions
/// (tests, one tenant's own processes). The node agent uses [`holds`] with
/// the priorities of the allocations.
///
/// A low-priority container's ordinal is held while another container of
/// high priority launched on the same GPU within `active_window`; the hold
/// lasts until `now + hold_for` unless a later call renews or releases it.
pub fn arbitrate<G: PartialEq>(
    members: &[Member<'_, G>],
    now: u64,
    active_window: u64,
    hold_for: u64,
) -> usize {
    let contenders: Vec<Contender<'_, G>> = members
        .iter()
        .map(|m| Contender {
            priority: m.region.priority(),
            launches: m.region,
            gpus: &m.gpus,
        })
        .collect();
    let decided = holds(&contenders, now, active_window);
    let mut held = 0;
    for (member, devices) in members.iter().zip(decided) {
        if member.region.priority() == Priority::High {
            continue;
        }
        member.region.set_hold(devices, now + hold_for);
        held += usize::from(devices != 0);
    }
    held
}
