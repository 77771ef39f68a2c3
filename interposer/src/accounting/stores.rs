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
//! - a resync reads what the driver holds (`cuMemPoolGetAttribute`,
//!   `cuDeviceGetGraphMemAttribute`) and charges exactly `max(live, held)`:
//!   after frees the driver released, a trim, a threshold change, and before
//!   an allocation is refused.
//!
//! So a store is never charged less than the driver holds for it once a
//! resync has seen it, and what it gives back is returned at the next resync.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_vgpu_region::SlotId;

use super::{Allocation, Enforcer, Key, Owner};
use crate::log::{DEBUG, WARN};
use crate::sys::{CUDA_ERROR_OUT_OF_MEMORY, CUdevice, CUresult};

/// A store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum StoreId {
    /// A memory pool (`CUmemoryPool`).
    Pool(u64),
    /// The graph memory of a device (CUDA ordinal).
    Graph(usize),
}

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

impl Stores {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<StoreId, Store>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every store (a fork child: the parent's are the parent's).
    pub(super) fn clear(&self) {
        self.lock().clear();
    }
}

/// Bytes one allocation added to a store: [`Enforcer::store_track`] keeps
/// them as the allocation's, [`Enforcer::store_untake`] gives them back.
#[must_use]
#[derive(Debug)]
pub(crate) struct Taken {
    id: StoreId,
    dev: usize,
    slot: SlotId,
    bytes: u64,
    /// The part reserved in the region (the rest was the store's own).
    from_region: u64,
}

impl Enforcer {
    /// Adds `bytes` to store `id` on `dev` before the driver allocates them:
    /// what the store holds beyond its live bytes is used first, the rest is
    /// reserved in the region (`CUDA_ERROR_OUT_OF_MEMORY` if it does not
    /// fit). `Ok(None)`: the device is not accounted.
    pub(crate) fn store_take(
        &self,
        id: StoreId,
        dev: CUdevice,
        bytes: u64,
    ) -> Result<Option<Taken>, CUresult> {
        let Some(region) = &self.region else {
            return Ok(None);
        };
        let Ok(index) = usize::try_from(dev) else {
            return Ok(None);
        };
        if index >= tessera_vgpu_region::MAX_DEVICES && !self.any_limit {
            return Ok(None);
        }
        let Some(slot) = self.slot(region) else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        // Take from what the store already holds, under the lock, so that two
        // threads never use the same bytes; reserve the rest outside it (the
        // slow path of a reservation resyncs stores, which takes the lock).
        let (slot, own) = {
            let mut stores = self.stores.lock();
            let store = stores.entry(id).or_insert(Store {
                dev: index,
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
            && let Err(rc) = self.reserve(region, slot, index, rest)
        {
            if let Some(store) = self.stores.lock().get_mut(&id) {
                store.live -= own;
            }
            return Err(rc);
        }
        let mut stores = self.stores.lock();
        match stores.get_mut(&id) {
            Some(store) => {
                store.live += rest;
                store.charged += rest;
            }
            // Cleared by a fork in between: nothing of it is ours.
            None => region.release(slot, index, rest),
        }
        Ok(Some(Taken {
            id,
            dev: index,
            slot,
            bytes,
            from_region: rest,
        }))
    }

    /// Gives back what [`Enforcer::store_take`] added when the driver did
    /// not allocate.
    pub(crate) fn store_untake(&self, taken: Taken) {
        let mut stores = self.stores.lock();
        if let Some(store) = stores.get_mut(&taken.id) {
            store.live = store.live.saturating_sub(taken.bytes);
            let back = taken.from_region.min(store.charged - store.live);
            store.charged -= back;
            if let Some(region) = &self.region {
                region.release(taken.slot, taken.dev, back);
            }
        }
    }

    /// Tracks the allocation the taken bytes became; its free makes them
    /// the store's (see [`Enforcer::freed`]).
    pub(crate) fn store_track(&self, key: Key, taken: Taken) {
        self.insert(
            key,
            Allocation {
                dev: taken.dev,
                bytes: taken.bytes,
                slot: taken.slot,
                owner: Owner::Store(taken.id),
                refs: 1,
            },
        );
    }

    /// A freed allocation's bytes stay charged to its store until a resync
    /// sees the driver release them; resyncs it now.
    pub(super) fn store_give(&self, id: StoreId, bytes: u64) {
        let closed = {
            let mut stores = self.stores.lock();
            let Some(store) = stores.get_mut(&id) else {
                return;
            };
            store.live = store.live.saturating_sub(bytes);
            store.closed && store.live == 0
        };
        self.stores.retaining.store(true, Ordering::Relaxed);
        if closed {
            self.store_drop(id);
        } else {
            let _ = self.store_resync(id);
        }
    }

    /// Charges store `id` what the driver now says it holds (at least its
    /// live bytes); returns the bytes given back to the region, or
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the driver holds more than was
    /// charged and the rest does not fit (it stays uncharged and is logged).
    pub(crate) fn store_resync(&self, id: StoreId) -> Result<u64, CUresult> {
        match crate::memory::store_held(id) {
            Some(held) => self.store_set_held(id, held),
            None => Ok(0),
        }
    }

    /// [`Enforcer::store_resync`] with the driver's answer, `held` bytes.
    fn store_set_held(&self, id: StoreId, held: u64) -> Result<u64, CUresult> {
        let Some(region) = &self.region else {
            return Ok(0);
        };
        let (dev, slot, grow) = {
            let mut stores = self.stores.lock();
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
            Err(over) => self.reserve_after_reclaim(region, slot, dev, grow, over),
        };
        match result {
            Ok(()) => {
                match self.stores.lock().get_mut(&id) {
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
    pub(super) fn resync_stores(&self, dev: usize) -> u64 {
        let ids: Vec<StoreId> = self
            .stores
            .lock()
            .iter()
            .filter(|(_, s)| s.dev == dev)
            .map(|(id, _)| *id)
            .collect();
        let back = ids
            .into_iter()
            .map(|id| self.store_resync(id).unwrap_or(0))
            .sum();
        if back > 0 {
            log!(DEBUG, "device {dev}: stores gave back {back} bytes");
        }
        back
    }

    /// After a synchronisation, when the driver gives back what pools hold
    /// beyond their release threshold: resyncs every store charged more
    /// than its live bytes. One relaxed load when there is none.
    pub(crate) fn stores_synchronized(&self) {
        if !self.stores.retaining.swap(false, Ordering::Relaxed) {
            return;
        }
        let ids: Vec<StoreId> = self
            .stores
            .lock()
            .iter()
            .filter(|(_, s)| s.charged > s.live)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let _ = self.store_resync(id);
        }
        if self.stores.lock().values().any(|s| s.charged > s.live) {
            // Some keep memory (their release threshold): look again next time.
            self.stores.retaining.store(true, Ordering::Relaxed);
        }
    }

    /// The pool behind store `id` was destroyed: its charge goes now if it
    /// has no live allocations, else with the last of them.
    pub(crate) fn store_close(&self, id: StoreId) {
        let empty = {
            let mut stores = self.stores.lock();
            let Some(store) = stores.get_mut(&id) else {
                return;
            };
            store.closed = true;
            store.live == 0
        };
        if empty {
            self.store_drop(id);
        }
    }

    fn store_drop(&self, id: StoreId) {
        let store = self.stores.lock().remove(&id);
        if let (Some(store), Some(region)) = (store, &self.region) {
            region.release(store.slot, store.dev, store.charged);
        }
    }
}
