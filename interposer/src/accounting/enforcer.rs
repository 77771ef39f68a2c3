//! One process's accounting in the container's region: the reservation
//! made before each allocation, the allocations it became (sharded by
//! [`Key`]), what freeing them gives back, and the stores (pools, graph
//! memory) that keep bytes charged after their allocations are freed.
//!
//! No driver call is made here: what a store holds is asked through the
//! [`Held`] function the enforcer is made with.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Mutex;

use tessera_vgpu_region::{MAX_DEVICES, Region, SlotId};

use crate::accounting::keys::{AddressHasher, Key, SHARDS};
use crate::accounting::reclaim::reserve_after_reclaim;
use crate::accounting::slot::OwnSlot;
use crate::accounting::stores::{Held, StoreId, Stores, Taken};
use crate::log::DEBUG;
use crate::sys::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUdevice, CUresult};

type Allocations = HashMap<Key, Allocation, BuildHasherDefault<AddressHasher>>;

/// One tracked allocation.
#[derive(Clone, Copy, Debug)]
struct Allocation {
    dev: usize,
    bytes: u64,
    slot: SlotId,
    /// Where its bytes are charged.
    owner: Owner,
    /// References the driver counts for it (`cuMemRetainAllocationHandle`
    /// adds one); its bytes are returned with the last.
    refs: u32,
}

/// Where an allocation's bytes are charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// In the region, on its own: returned when it is freed.
    Region,
    /// In a store (a memory pool or a device's graph memory), which keeps
    /// the bytes charged until the driver says it gave them back.
    Store(StoreId),
}

/// Bytes reserved in the region for an allocation the driver has not made
/// yet: [`Enforcer::track`] keeps them, [`Enforcer::cancel`] returns them.
#[must_use]
#[derive(Debug)]
pub(crate) struct Reservation {
    slot: SlotId,
    dev: usize,
    bytes: u64,
}

/// Accounting and enforcement for one process.
pub(crate) struct Enforcer {
    limits: [u64; MAX_DEVICES],
    any_limit: bool,
    region: Option<Region>,
    /// This process's slot in the region.
    slot: OwnSlot,
    /// Pointer or handle → allocation, sharded.
    allocations: [Mutex<Allocations>; SHARDS],
    /// Memory pools and graph memory: what they hold beyond their live
    /// allocations.
    stores: Stores,
    /// What the driver holds for a store.
    held: Held,
}

impl Enforcer {
    /// Accounting in `region` (none: nothing is accounted) under `limits`
    /// (bytes per CUDA ordinal, 0 for none); `held` tells what the driver
    /// holds for a store.
    pub(crate) fn new(limits: [u64; MAX_DEVICES], region: Option<Region>, held: Held) -> Self {
        Self {
            any_limit: limits.iter().any(|&l| l != 0),
            limits,
            region,
            slot: OwnSlot::default(),
            allocations: std::array::from_fn(|_| Mutex::new(Allocations::default())),
            stores: Stores::default(),
            held,
        }
    }

    /// The container's region, if this process uses one.
    pub(crate) fn region(&self) -> Option<&Region> {
        self.region.as_ref()
    }

    /// This process's slot in the region, claimed on first use (one load
    /// once claimed).
    pub(crate) fn own_slot(&self) -> Option<SlotId> {
        self.slot(self.region.as_ref()?)
    }

    /// The limit of CUDA ordinal `dev` in bytes, if any.
    pub(crate) fn limit(&self, dev: CUdevice) -> Option<u64> {
        let limit = *self.limits.get(usize::try_from(dev).ok()?)?;
        (limit != 0).then_some(limit)
    }

    /// Bytes the container holds on `dev`.
    pub(crate) fn used(&self, dev: CUdevice) -> u64 {
        match (&self.region, usize::try_from(dev)) {
            (Some(region), Ok(dev)) => region.used(dev),
            _ => 0,
        }
    }

    /// This process's slot, claimed on first use and again in a fork child
    /// (one load of the fork count on this path).
    fn slot(&self, region: &Region) -> Option<SlotId> {
        self.slot.get(region, || self.forget())
    }

    /// Forgets the parent's allocations and stores, in a child process.
    fn forget(&self) {
        for shard in &self.allocations {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        self.stores.clear();
    }

    /// The device index of CUDA ordinal `dev` and this process's slot, when
    /// `dev` is accounted: `Ok(None)` when it is not (no region, or an
    /// ordinal beyond the region's devices while no device has a limit),
    /// `CUDA_ERROR_OUT_OF_MEMORY` when no slot can be had.
    fn accounted(&self, dev: CUdevice) -> Result<Option<(&Region, usize, SlotId)>, CUresult> {
        let Some(region) = &self.region else {
            return Ok(None);
        };
        let Ok(index) = usize::try_from(dev) else {
            return Ok(None);
        };
        if index >= MAX_DEVICES && !self.any_limit {
            return Ok(None);
        }
        let Some(slot) = self.slot(region) else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        Ok(Some((region, index, slot)))
    }

    /// Reserves `bytes` on `dev` for an allocation about to be made.
    ///
    /// `Ok(None)`: the device is not accounted (no region, or an ordinal
    /// beyond the region's devices while no device has a limit); the caller
    /// just calls the driver. The reservation happens before the driver is
    /// called, so concurrent processes never overcommit.
    pub(crate) fn reserve_for(
        &self,
        dev: CUdevice,
        bytes: u64,
    ) -> Result<Option<Reservation>, CUresult> {
        let Some((region, index, slot)) = self.accounted(dev)? else {
            return Ok(None);
        };
        if let Err(rc) = self.reserve(region, slot, index, bytes) {
            // Slow path: a raw `clone` child still uses its parent's slot
            // until a pid check like this one.
            match self.slot.claim(region, true, || self.forget()) {
                Some(own) if own != slot => {
                    self.reserve(region, own, index, bytes)?;
                    return Ok(Some(Reservation {
                        slot: own,
                        dev: index,
                        bytes,
                    }));
                }
                _ => return Err(rc),
            }
        }
        Ok(Some(Reservation {
            slot,
            dev: index,
            bytes,
        }))
    }

    /// Grows or shrinks a reservation to `bytes`, the allocation's real size.
    pub(crate) fn resize(&self, r: &mut Reservation, bytes: u64) -> Result<(), CUresult> {
        let Some(region) = &self.region else {
            return Ok(());
        };
        if bytes > r.bytes {
            self.reserve(region, r.slot, r.dev, bytes - r.bytes)?;
        } else {
            region.release(r.slot, r.dev, r.bytes - bytes);
        }
        r.bytes = bytes;
        Ok(())
    }

    /// Returns a reservation whose allocation did not happen.
    pub(crate) fn cancel(&self, r: Reservation) {
        if let Some(region) = &self.region {
            region.release(r.slot, r.dev, r.bytes);
        }
    }

    /// Keeps a reservation as the charge of `key`, until [`Enforcer::freed`].
    pub(crate) fn track(&self, key: Key, r: Reservation) {
        self.insert(
            key,
            Allocation {
                dev: r.dev,
                bytes: r.bytes,
                slot: r.slot,
                owner: Owner::Region,
                refs: 1,
            },
        );
    }

    fn insert(&self, key: Key, allocation: Allocation) {
        let replaced = self.allocations[key.shard()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, allocation);
        if let Some(old) = replaced {
            // The driver reused a key we still held (e.g. an address freed
            // behind our back): that allocation is gone.
            self.give_back(key, old);
        }
    }

    /// Reserves `estimate` bytes on `dev`, runs `alloc`, and tracks the
    /// pointer or handle it returns with the bytes it really took.
    ///
    /// `alloc` returns the driver's result and, on success, the key and the
    /// real size; `undo` frees an allocation whose real size no longer fits.
    /// The reservation happens before the driver is called, so concurrent
    /// processes never overcommit; it is released when the driver fails.
    pub(crate) fn charged(
        &self,
        dev: CUdevice,
        estimate: u64,
        alloc: impl FnOnce() -> Result<(Key, u64), CUresult>,
        undo: impl FnOnce(Key),
    ) -> CUresult {
        let mut reservation = match self.reserve_for(dev, estimate) {
            Ok(Some(r)) => r,
            Ok(None) => return alloc().err().unwrap_or(CUDA_SUCCESS),
            Err(rc) => return rc,
        };
        let (key, bytes) = match alloc() {
            Ok(done) => done,
            Err(rc) => {
                self.cancel(reservation);
                return rc;
            }
        };
        if let Err(rc) = self.resize(&mut reservation, bytes) {
            self.cancel(reservation);
            undo(key);
            return rc;
        }
        self.track(key, reservation);
        CUDA_SUCCESS
    }

    /// One reservation, retried after stores gave back what the driver
    /// released and after reclaiming dead processes.
    fn reserve(
        &self,
        region: &Region,
        slot: SlotId,
        dev: usize,
        bytes: u64,
    ) -> Result<(), CUresult> {
        let Err(over) = region.try_reserve(slot, dev, bytes) else {
            return Ok(());
        };
        if self.stores.resync_device(region, dev, self.held) > 0
            && region.try_reserve(slot, dev, bytes).is_ok()
        {
            return Ok(());
        }
        reserve_after_reclaim(region, slot, dev, bytes, over)
    }

    /// Frees `key` with `free` and returns its bytes when the driver
    /// succeeded (a retained handle's bytes with its last reference).
    /// Untracked pointers and handles are passed through.
    pub(crate) fn freed(&self, key: Key, free: impl FnOnce() -> CUresult) -> CUresult {
        if let Some(region) = &self.region {
            // Forgets the parent's allocations in a fork child before looking.
            self.slot(region);
        }
        let shard = &self.allocations[key.shard()];
        let taken = {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            match map.get_mut(&key) {
                Some(a) if a.refs > 1 => {
                    a.refs -= 1;
                    Some((*a, false))
                }
                Some(_) => map.remove(&key).map(|a| (a, true)),
                None => None,
            }
        };
        let rc = free();
        match taken {
            Some((a, true)) if rc == CUDA_SUCCESS => self.give_back(key, a),
            Some((a, last)) if rc != CUDA_SUCCESS => {
                let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
                if last {
                    map.insert(key, a);
                } else if let Some(kept) = map.get_mut(&key) {
                    kept.refs += 1;
                }
            }
            _ => {}
        }
        rc
    }

    /// Counts one more driver reference to `key` (`cuMemRetainAllocationHandle`);
    /// false when `key` is not tracked.
    pub(crate) fn retained(&self, key: Key) -> bool {
        match self.allocations[key.shard()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&key)
        {
            Some(a) => {
                a.refs = a.refs.saturating_add(1);
                true
            }
            None => false,
        }
    }

    /// Returns the bytes of a freed allocation to the region or its store.
    fn give_back(&self, key: Key, a: Allocation) {
        let Some(region) = &self.region else {
            return;
        };
        match a.owner {
            Owner::Region => region.release(a.slot, a.dev, a.bytes),
            Owner::Store(id) => {
                log!(DEBUG, "{key:?}: {} bytes back to {id:?}", a.bytes);
                self.stores.give(region, id, a.bytes, self.held);
            }
        }
    }

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
        let Some((region, index, slot)) = self.accounted(dev)? else {
            return Ok(None);
        };
        let reserve = |slot, rest| self.reserve(region, slot, index, rest);
        self.stores
            .take(region, id, index, slot, bytes, reserve)
            .map(Some)
    }

    /// Gives back what [`Enforcer::store_take`] added when the driver did
    /// not allocate.
    pub(crate) fn store_untake(&self, taken: Taken) {
        self.stores.untake(self.region.as_ref(), taken);
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

    /// Charges store `id` what the driver now says it holds (at least its
    /// live bytes); returns the bytes given back to the region, or
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the driver holds more than was
    /// charged and the rest does not fit.
    pub(crate) fn store_resync(&self, id: StoreId) -> Result<u64, CUresult> {
        self.stores.resync(self.region.as_ref(), id, self.held)
    }

    /// After a synchronisation: resyncs every store charged more than its
    /// live bytes (one relaxed load when there is none).
    pub(crate) fn stores_synchronized(&self) {
        self.stores.synchronized(self.region.as_ref(), self.held);
    }

    /// The pool behind store `id` was destroyed: its charge goes now if it
    /// has no live allocations, else with the last of them.
    pub(crate) fn store_close(&self, id: StoreId) {
        self.stores.close(self.region.as_ref(), id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tessera_vgpu_region::{Limits, Priority};

    use super::*;

    const MIB: u64 = 1 << 20;

    /// An enforcer with a 10 MiB limit on device 0 in a fresh region file,
    /// and what the "driver" says every store holds.
    fn enforcer(held: Held) -> (tempfile::TempDir, Enforcer) {
        let dir = tempfile::tempdir().unwrap();
        let mut memory = [0; MAX_DEVICES];
        memory[0] = 10 * MIB;
        let limits = Limits {
            memory,
            sm_percent: [0; MAX_DEVICES],
            priority: Priority::Low,
        };
        let (region, _) = Region::create_or_open_with(&dir.path().join("r"), &limits).unwrap();
        (dir, Enforcer::new(memory, Some(region), held))
    }

    #[test]
    fn a_reservation_is_kept_by_its_allocation_and_returned_by_its_free() {
        let (_dir, e) = enforcer(|_| None);
        assert_eq!(e.limit(0), Some(10 * MIB));
        assert_eq!(e.limit(1), None);
        let rc = e.charged(0, 4 * MIB, || Ok((Key::Pointer(1), 6 * MIB)), |_| {});
        assert_eq!((rc, e.used(0)), (CUDA_SUCCESS, 6 * MIB));
        // Over the limit: refused before the driver is called.
        let called = std::cell::Cell::new(false);
        let rc = e.charged(
            0,
            5 * MIB,
            || {
                called.set(true);
                Ok((Key::Pointer(2), 5 * MIB))
            },
            |_| {},
        );
        assert_eq!((rc, called.get()), (CUDA_ERROR_OUT_OF_MEMORY, false));
        // A failed free keeps the charge; a successful one returns it.
        assert_eq!(e.freed(Key::Pointer(1), || 1), 1);
        assert_eq!(e.used(0), 6 * MIB);
        assert_eq!(e.freed(Key::Pointer(1), || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(e.used(0), 0);
        // Untracked keys pass through.
        assert_eq!(e.freed(Key::Pointer(3), || 7), 7);
    }

    #[test]
    fn a_retained_handle_is_returned_with_its_last_reference() {
        let (_dir, e) = enforcer(|_| None);
        let r = e.reserve_for(0, 2 * MIB).unwrap().unwrap();
        e.track(Key::Handle(9), r);
        assert!(e.retained(Key::Handle(9)) && !e.retained(Key::Handle(8)));
        e.freed(Key::Handle(9), || CUDA_SUCCESS);
        assert_eq!(e.used(0), 2 * MIB);
        e.freed(Key::Handle(9), || CUDA_SUCCESS);
        assert_eq!(e.used(0), 0);
    }

    /// What the fake driver holds in the pool of the store test.
    static POOL_HOLDS: AtomicU64 = AtomicU64::new(0);

    #[test]
    fn a_store_stays_charged_what_the_driver_holds_after_a_free() {
        let (_dir, e) = enforcer(|_| Some(POOL_HOLDS.load(Ordering::Relaxed)));
        let pool = StoreId::Pool(1);
        let taken = e.store_take(pool, 0, 4 * MIB).unwrap().unwrap();
        e.store_track(Key::Pointer(1), taken);
        POOL_HOLDS.store(4 * MIB, Ordering::Relaxed);
        assert_eq!(e.used(0), 4 * MIB);
        // Freed, but the pool keeps the memory: still charged.
        e.freed(Key::Pointer(1), || CUDA_SUCCESS);
        assert_eq!(e.used(0), 4 * MIB);
        // The next allocation uses what the pool holds: nothing more.
        let taken = e.store_take(pool, 0, 2 * MIB).unwrap().unwrap();
        assert_eq!(e.used(0), 4 * MIB);
        e.store_untake(taken);
        // The driver gave the memory back: a synchronisation returns it.
        POOL_HOLDS.store(0, Ordering::Relaxed);
        e.stores_synchronized();
        assert_eq!(e.used(0), 0);
        // A store that does not fit is refused.
        assert_eq!(
            e.store_take(pool, 0, 11 * MIB).unwrap_err(),
            CUDA_ERROR_OUT_OF_MEMORY
        );
    }
}
