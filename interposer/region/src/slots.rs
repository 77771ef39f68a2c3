//! Process slots: claiming, reserving and releasing memory, and reclaiming
//! the slots of processes that are gone.

use std::sync::atomic::Ordering;

use crate::process::process_alive;
use crate::region::{
    CLAIMING, Error, FREE, LIVE, OverLimit, RECLAIMING, Reclaimed, Region, Result, SlotId,
    saturating_sub,
};

impl Region {
    /// Claims a free slot for process `pid` started at `start_time`.
    ///
    /// A slot still marked as held by the same pid with another start time
    /// (pid reuse) is reclaimed first. When every slot is taken, dead
    /// processes are reclaimed and the claim is retried once.
    pub fn claim_slot(&self, pid: u32, start_time: u64) -> Result<SlotId> {
        for (index, slot) in self.layout().slots.iter().enumerate() {
            if slot.state.load(Ordering::Acquire) == LIVE
                && slot.pid.load(Ordering::Relaxed) == pid
                && slot.start_time.load(Ordering::Relaxed) != start_time
            {
                self.reclaim_slot(index);
            }
        }
        for attempt in 0..2 {
            for (index, slot) in self.layout().slots.iter().enumerate() {
                if slot
                    .state
                    .compare_exchange(FREE, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    slot.pid.store(pid, Ordering::Relaxed);
                    slot.start_time.store(start_time, Ordering::Relaxed);
                    slot.host_pid.store(0, Ordering::Relaxed);
                    slot.active_devices.store(0, Ordering::Relaxed);
                    slot.active_at.store(0, Ordering::Relaxed);
                    for used in &slot.used {
                        used.store(0, Ordering::Relaxed);
                    }
                    slot.state.store(LIVE, Ordering::Release);
                    return Ok(SlotId(index));
                }
            }
            if attempt == 0 {
                self.reclaim_dead();
            }
        }
        Err(Error::SlotsFull)
    }

    /// Reserves `bytes` on device `dev` for `slot`, unless that would take the
    /// container over the device's limit.
    ///
    /// One compare-and-swap on the device counter decides; the slot's own
    /// counter (attribution and cleanup) follows. Devices beyond
    /// [`MAX_DEVICES`](crate::region::MAX_DEVICES) are refused with a zero limit.
    pub fn try_reserve(&self, slot: SlotId, dev: usize, bytes: u64) -> Result<(), OverLimit> {
        let layout = self.layout();
        let Some(device) = layout.devices.get(dev) else {
            return Err(OverLimit {
                requested: bytes,
                used: 0,
                limit: 0,
            });
        };
        let limit = device.limit.load(Ordering::Relaxed);
        let mut used = device.used.load(Ordering::Relaxed);
        let new = loop {
            let new = used
                .checked_add(bytes)
                .filter(|&n| limit == 0 || n <= limit);
            let Some(new) = new else {
                return Err(OverLimit {
                    requested: bytes,
                    used,
                    limit,
                });
            };
            match device
                .used
                .compare_exchange_weak(used, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break new,
                Err(current) => used = current,
            }
        };
        layout.slots[slot.0].used[dev].fetch_add(bytes, Ordering::Relaxed);
        device.peak.fetch_max(new, Ordering::Relaxed);
        Ok(())
    }

    /// Returns `bytes` reserved by `slot` on device `dev`.
    pub fn release(&self, slot: SlotId, dev: usize, bytes: u64) {
        let layout = self.layout();
        let Some(device) = layout.devices.get(dev) else {
            return;
        };
        saturating_sub(&layout.slots[slot.0].used[dev], bytes);
        saturating_sub(&device.used, bytes);
    }

    /// Frees the slots of processes that no longer exist and returns their
    /// usage to the device counters.
    ///
    /// Slots hold pids as the container sees them: call this (and
    /// [`Region::claim_slot`]) only from inside the container's pid
    /// namespace. A reader outside it uses [`Region::snapshot`].
    pub fn reclaim_dead(&self) -> Reclaimed {
        let mut reclaimed = Reclaimed::default();
        for (index, slot) in self.layout().slots.iter().enumerate() {
            if slot.state.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let pid = slot.pid.load(Ordering::Relaxed);
            let start_time = slot.start_time.load(Ordering::Relaxed);
            if !process_alive(pid, start_time)
                && let Some(bytes) = self.reclaim_slot(index)
            {
                reclaimed.slots += 1;
                reclaimed.bytes += bytes;
            }
        }
        reclaimed
    }

    /// Returns a slot's usage and frees it; `None` when another process won
    /// the race to reclaim it.
    pub(crate) fn reclaim_slot(&self, index: usize) -> Option<u64> {
        let layout = self.layout();
        let slot = &layout.slots[index];
        slot.state
            .compare_exchange(LIVE, RECLAIMING, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        let mut total = 0u64;
        for (used, device) in slot.used.iter().zip(&layout.devices) {
            let bytes = used.swap(0, Ordering::AcqRel);
            saturating_sub(&device.used, bytes);
            total = total.saturating_add(bytes);
        }
        slot.pid.store(0, Ordering::Relaxed);
        slot.start_time.store(0, Ordering::Relaxed);
        slot.host_pid.store(0, Ordering::Relaxed);
        slot.active_devices.store(0, Ordering::Relaxed);
        slot.active_at.store(0, Ordering::Relaxed);
        slot.state.store(FREE, Ordering::Release);
        Some(total)
    }
}
