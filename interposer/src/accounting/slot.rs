//! This process's slot in the region: claimed on first use, and again in a
//! fork child (noticed with one load) or a raw `clone` child (noticed by a
//! pid check on slow paths).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

use tessera_vgpu_region::{Region, SlotId, process_start_time};

use crate::log::{DEBUG, ERROR};

/// Incremented in the child of every `fork` (a `pthread_atfork` handler), so
/// the allocation path notices a fork with one load instead of a `getpid`
/// system call.
static FORKS: AtomicU32 = AtomicU32::new(0);

extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Which slot this process owns.
#[derive(Default)]
pub(crate) struct OwnSlot {
    /// `forks << 32 | slot + 1` when the slot was claimed (`forks` = [`FORKS`]
    /// then); 0 before the first claim. Another fork count means we are a
    /// fork child.
    owner: AtomicU64,
    /// The pid that claimed the slot, checked on slow paths (a raw `clone`
    /// child runs no fork handler).
    owner_pid: AtomicU32,
    /// Serialises slot claims within the process.
    claim: Mutex<()>,
}

impl OwnSlot {
    /// This process's slot, claimed on first use and again in a fork child
    /// (one load of the fork count on this path). `forget` runs first in a
    /// child: the parent's allocations are the parent's.
    pub(crate) fn get(&self, region: &Region, forget: impl FnOnce()) -> Option<SlotId> {
        let owner = self.owner.load(Ordering::Acquire);
        if owner != 0 && owner >> 32 == u64::from(FORKS.load(Ordering::Relaxed)) {
            return slot_of(owner);
        }
        self.claim(region, false, forget)
    }

    /// Claims a slot unless this process already owns one; `check_pid`
    /// also compares the pid (a system call), for slow paths.
    pub(crate) fn claim(
        &self,
        region: &Region,
        check_pid: bool,
        forget: impl FnOnce(),
    ) -> Option<SlotId> {
        let _guard = self.claim.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        let forks = FORKS.load(Ordering::Relaxed);
        let owner = self.owner.load(Ordering::Acquire);
        let same_pid = self.owner_pid.load(Ordering::Relaxed) == pid;
        if owner != 0 && owner >> 32 == u64::from(forks) && (!check_pid || same_pid) {
            return slot_of(owner);
        }
        static ATFORK: Once = Once::new();
        ATFORK.call_once(|| {
            // SAFETY: registers a handler that only increments an atomic.
            let rc = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
            if rc != 0 {
                log!(
                    ERROR,
                    "pthread_atfork failed ({rc}); fork children are noticed on slow paths only"
                );
            }
        });
        if owner != 0 && !same_pid {
            // A child: the parent's allocations are the parent's.
            forget();
        }
        let start_time = process_start_time(pid).unwrap_or(0);
        match region.claim_slot(pid, start_time) {
            Ok(slot) => {
                log!(DEBUG, "claimed region slot {}", slot.index());
                self.owner_pid.store(pid, Ordering::Relaxed);
                self.owner.store(
                    u64::from(forks) << 32 | (slot.index() as u64 + 1),
                    Ordering::Release,
                );
                Some(slot)
            }
            Err(e) => {
                log!(ERROR, "{e}");
                None
            }
        }
    }
}

fn slot_of(owner: u64) -> Option<SlotId> {
    // The slot index is stored + 1 in the low half; see `OwnSlot::owner`.
    SlotId::from_index(((owner & 0xffff_ffff) as usize).checked_sub(1)?)
}
