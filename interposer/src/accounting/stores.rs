//! Stores: driver-side caches of device memory that outlive the allocations
//! made from them — a memory pool (stream-ordered allocations) and a
//! device's graph memory (the allocations of executable graphs).
//!
//! A store's allocations are its *live* bytes. The driver may hold more than
//! that (a pool keeps freed memory up to its release threshold, graph memory
//! keeps what destroyed graphs used until it is trimmed), so a store is
//! *charged* `max(live, what the driver reports it holds)`:
//!
//! - an allocation first uses what the store is charged beyond its live
//!   bytes (memory the driver keeps for reuse), and reserves only the rest in
//!   the region, before the driver is called;
//! - a free makes its bytes part of what the store holds: they stay charged;
//! - a resync asks what the driver holds (a [`Held`] function, given by the
//!   policy layer: `cuMemPoolGetAttribute`, `cuDeviceGetGraphMemAttribute`)
//!   and charges exactly `max(live, held)`:
//!   after frees the driver released, a trim, a threshold change, and before
//!   an allocation is refused.
//!
//! So a store is never charged less than the driver holds for it once a
//! resync has seen it, and what it gives back is returned at the next resync.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_vgpu_region::{Region, SlotId};

use crate::accounting::reclaim::reserve_after_reclaim;
use crate::log::{DEBUG, WARN};
use crate::sys::CUresult;

/// A store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum StoreId {
    /// A memory pool (`CUmemoryPool`).
    Pool(u64),
    /// The graph memory of a device (CUDA ordinal).
    Graph(usize),
}

/// What the driver says it holds for a store, `None` when it cannot say;
/// given to the stores by whoever asks the driver.
pub(crate) type Held = fn(StoreId) -> Option<u64>;

#[derive(Debug)]
struct Store {
    dev: usize,
    slot: SlotId,
    /// Bytes of the allocations made from it that are not freed.
    live: u64,
    /// Bytes charged in the region for it, at least `live`.
    charged: u64,
    /// The pool was destroyed: its charge goes when its last allocation does.
    closed: bool,
}

/// The stores of this process.
#[derive(Default)]
pub(crate) struct Stores {
    map: Mutex<HashMap<StoreId, Store>>,
    /// Set when a store may be charged more than its live bytes (after a
    /// free), so that a synchronisation resyncs; one load when none is.
    retaining: AtomicBool,
}

/// Bytes one allocation added to a store: the enforcer keeps them as the
/// allocation's, or gives them back with [`Stores::untake`].
#[must_use]
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) id: StoreId,
    pub(crate) dev: usize,
    pub(crate) slot: SlotId,
    pub(crate) bytes: u64,
    /// The part reserved in the region (the rest was the store's own).
    from_region: u64,
}

impl Stores {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<StoreId, Store>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every store (a fork child: the parent's are the parent's).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Adds `bytes` to store `id` on device `dev` (whose slot in the region
    /// is `slot`) before the driver allocates them: what the store holds
    /// beyond its live bytes is used first, the rest is reserved with
    /// `reserve(store's slot, bytes)` (`CUDA_ERROR_OUT_OF_MEMORY` if it does
    /// not fit).
    pub(crate) fn take(
        &self,
        region: &Region,
        id: StoreId,
        dev: usize,
        slot: SlotId,
        bytes: u64,
        reserve: impl FnOnce(SlotId, u64) -> Result<(), CUresult>,
    ) -> Result<Taken, CUresult> {
        // Take from what the store already holds, under the lock, so that two
        // threads never use the same bytes; reserve the rest outside it (the
        // slow path of a reservation resyncs stores, which takes the lock).
        let (slot, own) = {
            let mut stores = self.lock();
            let store = stores.entry(id).or_insert(Store {
                dev,
                slot,
                live: 0,
                charged: 0,
                closed: false,
            });
            let own = bytes.min(store.charged - store.live);
            store.live += own;
            (store.slot, own)
        };
        let rest = bytes - own;
        if rest > 0
            && let Err(rc) = reserve(slot, rest)
        {
            if let Some(store) = self.lock().get_mut(&id) {
                store.live -= own;
            }
            return Err(rc);
        }
        let mut stores = self.lock();
        match stores.get_mut(&id) {
            Some(store) => {
                store.live += rest;
                store.charged += rest;
            }
            // Cleared by a fork in between: nothing of it is ours.
            None => region.release(slot, dev, rest),
        }
        Ok(Taken {
            id,
            dev,
            slot,
            bytes,
            from_region: rest,
        })
    }

    /// Gives back what [`Stores::take`] added when the driver did not
    /// allocate.
    pub(crate) fn untake(&self, region: Option<&Region>, taken: Taken) {
        let mut stores = self.lock();
        if let Some(store) = stores.get_mut(&taken.id) {
            store.live = store.live.saturating_sub(taken.bytes);
            let back = taken.from_region.min(store.charged - store.live);
            store.charged -= back;
            if let Some(region) = region {
                region.release(taken.slot, taken.dev, back);
            }
        }
    }

    /// A freed allocation's bytes stay charged to its store until a resync
    /// sees the driver release them; resyncs it now.
    pub(crate) fn give(&self, region: &Region, id: StoreId, bytes: u64, held: Held) {
        let closed = {
            let mut stores = self.lock();
            let Some(store) = stores.get_mut(&id) else {
                return;
            };
            store.live = store.live.saturating_sub(bytes);
            store.closed && store.live == 0
        };
        self.retaining.store(true, Ordering::Relaxed);
        if closed {
            self.drop_store(Some(region), id);
        } else {
            let _ = self.resync(Some(region), id, held);
        }
    }

    /// Charges store `id` what the driver now says it holds (at least its
    /// live bytes); returns the bytes given back to the region, or
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the driver holds more than was
    /// charged and the rest does not fit (it stays uncharged and is logged).
    pub(crate) fn resync(
        &self,
        region: Option<&Region>,
        id: StoreId,
        held: Held,
    ) -> Result<u64, CUresult> {
        match held(id) {
            Some(held) => self.set_held(region, id, held),
            None => Ok(0),
        }
    }

    /// [`Stores::resync`] with the driver's answer, `held` bytes.
    fn set_held(&self, region: Option<&Region>, id: StoreId, held: u64) -> Result<u64, CUresult> {
        let Some(region) = region else {
            return Ok(0);
        };
        let (dev, slot, grow) = {
            let mut stores = self.lock();
            let Some(store) = stores.get_mut(&id) else {
                return Ok(0);
            };
            let target = held.max(store.live);
            if target <= store.charged {
                let back = store.charged - target;
                store.charged = target;
                region.release(store.slot, store.dev, back);
                return Ok(back);
            }
            (store.dev, store.slot, target - store.charged)
        };
        // The driver holds more than was charged (it grew a pool by more than
        // the allocations asked for). Charge it if it fits; the caller of an
        // allocation undoes it otherwise.
        let result = match region.try_reserve(slot, dev, grow) {
            Ok(()) => Ok(()),
            Err(over) => reserve_after_reclaim(region, slot, dev, grow, over),
        };
        match result {
            Ok(()) => {
                match self.lock().get_mut(&id) {
                    Some(store) => store.charged += grow,
                    None => region.release(slot, dev, grow),
                }
                Ok(0)
            }
            Err(rc) => {
                log!(
                    WARN,
                    "{id:?}: the driver holds {grow} bytes more than this container may use"
                );
                Err(rc)
            }
        }
    }

    /// Resyncs every store on device `dev` (the slow path of a reservation
    /// about to be refused); returns the bytes given back.
    pub(crate) fn resync_device(&self, region: &Region, dev: usize, held: Held) -> u64 {
        let ids: Vec<StoreId> = self
            .lock()
            .iter()
            .filter(|(_, s)| s.dev == dev)
            .map(|(id, _)| *id)
            .collect();
        let back = ids
            .into_iter()
            .map(|id| self.resync(Some(region), id, held).unwrap_or(0))
            .sum();
        if back > 0 {
            log!(DEBUG, "device {dev}: stores gave back {back} bytes");
        }
        back
    }

    /// After a synchronisation, when the driver gives back what pools hold
    /// beyond their release threshold: resyncs every store charged more
    /// than its live bytes. One relaxed load when there is none.
    pub(crate) fn synchronized(&self, region: Option<&Region>, held: Held) {
        if !self.retaining.swap(false, Ordering::Relaxed) {
            return;
        }
        let ids: Vec<StoreId> = self
            .lock()
            .iter()
            .filter(|(_, s)| s.charged > s.live)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let _ = self.resync(region, id, held);
        }
        if self.lock().values().any(|s| s.charged > s.live) {
            // Some keep memory (their release threshold): look again next time.
            self.retaining.store(true, Ordering::Relaxed);
        }
    }

    /// The pool behind store `id` was destroyed: its charge goes now if it
    /// has no live allocations, else with the last of them.
    pub(crate) fn close(&self, region: Option<&Region>, id: StoreId) {
        let empty = {
            let mut stores = self.lock();
            let Some(store) = stores.get_mut(&id) else {
                return;
            };
            store.closed = true;
            store.live == 0
        };
        if empty {
            self.drop_store(region, id);
        }
    }

    fn drop_store(&self, region: Option<&Region>, id: StoreId) {
        let store = self.lock().remove(&id);
        if let (Some(store), Some(region)) = (store, region) {
            region.release(store.slot, store.dev, store.charged);
        }
    }
}
