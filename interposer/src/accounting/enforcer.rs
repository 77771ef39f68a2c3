//! The per-process enforcement state: the configuration, the container's
//! shared region, this process's slot in it, and the allocations it made.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use tessera_vgpu_region::{MAX_DEVICES, Opened, Region, SlotId, process_start_time};

use crate::compute::Limiter;
use crate::config::{Config, Error};
use crate::log::{DEBUG, ERROR, INFO, WARN};
use crate::sys::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUdevice, CUdeviceptr, CUresult};

mod stores;

pub(crate) use stores::StoreId;
use stores::Stores;

/// What the hooks do in this process.
pub enum State {
    /// `CUDA_DISABLE_CONTROL=true`: pass everything through.
    Disabled,
    /// The configuration is invalid: refuse CUDA (the reason was printed).
    Refused,
    /// Account and enforce.
    Enforcing(Box<Enforcer>),
}

static STATE: OnceLock<State> = OnceLock::new();

/// The process's state, set up by the first hooked call.
pub fn state() -> &'static State {
    STATE.get_or_init(|| {
        let state = init(|name| std::env::var_os(name));
        crate::compute::set_mode(&state);
        state
    })
}

fn init(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> State {
    let config = match Config::from_vars(var) {
        Ok((config, warning)) => {
            crate::log::set_level(config.log_level);
            if let Some(warning) = warning {
                log!(WARN, "{warning}; using level 2");
            }
            config
        }
        Err(e) => {
            log!(ERROR, "invalid configuration, refusing CUDA: {e}");
            return State::Refused;
        }
    };
    if config.disabled {
        log!(INFO, "CUDA_DISABLE_CONTROL is set: not enforcing");
        return State::Disabled;
    }
    // The region is the container's to write: whatever is in it, this
    // process either attaches to a region whose header and limits are the
    // ones its environment gives (the environment comes from the node
    // agent's allocation and is authoritative), or refuses CUDA, saying
    // why. It never rebuilds a region: the container's other processes
    // hold reservations in it. See docs/interposer.md ("A corrupted region").
    let region = match Region::create_or_open_with(&config.region_path, &config.region_limits()) {
        Ok((
            region,
            Opened::Attached {
                limits_differ: true,
            },
        )) => {
            let found = region.limits();
            let wanted = config.region_limits();
            log!(
                ERROR,
                "refusing CUDA, not rebuilding the region: {}",
                Error::from(tessera_vgpu_region::Error::LimitsDiffer {
                    path: config.region_path.clone(),
                    found_memory: Box::new(found.memory),
                    found_sm: found.sm_percent,
                    found_priority: found.priority,
                    memory: Box::new(wanted.memory),
                    sm: wanted.sm_percent,
                    priority: wanted.priority,
                })
            );
            return State::Refused;
        }
        Ok((region, _)) => Some(region),
        Err(e) if config.any_limit() || config.any_sm_limit() => {
            log!(
                ERROR,
                "limits are set but the shared region is unusable, refusing CUDA (not rebuilding it): {}",
                Error::from(e)
            );
            return State::Refused;
        }
        Err(e) => {
            log!(
                WARN,
                "no memory limit is set and the shared region is unusable, not accounting: {}",
                Error::from(e)
            );
            None
        }
    };
    let limits = match &region {
        Some(region) => std::array::from_fn(|dev| region.limit(dev).unwrap_or(0)),
        None => config.limits,
    };
    log!(DEBUG, "limits per device (bytes, 0 = none): {limits:?}");
    let compute = region.as_ref().and_then(|region| {
        let percent: [u8; MAX_DEVICES] =
            std::array::from_fn(|dev| region.sm_limit(dev).unwrap_or(0));
        Limiter::new(percent, config.core_policy, region.priority())
    });
    if let Some(limiter) = &compute {
        log!(
            DEBUG,
            "compute limits per device (percent, 0 = none): {:?}, policy {}",
            limiter.percent(),
            config.core_policy.as_str()
        );
    }
    State::Enforcing(Box::new(Enforcer {
        compute,
        any_limit: limits.iter().any(|&l| l != 0),
        limits,
        region,
        owner: AtomicU64::new(0),
        owner_pid: AtomicU32::new(0),
        claim: Mutex::new(()),
        allocations: std::array::from_fn(|_| Mutex::new(Allocations::default())),
        stores: Stores::default(),
    }))
}

/// What an allocation is known by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    /// A device pointer (`cuMemAlloc*`), released by `cuMemFree` (or
    /// `cuMemFreeAsync`).
    Pointer(CUdeviceptr),
    /// A physical allocation handle (`cuMemCreate`), released by `cuMemRelease`.
    Handle(u64),
    /// A CUDA array (`cuArrayCreate_v2`, `cuArray3DCreate_v2`), released by
    /// `cuArrayDestroy`.
    Array(u64),
    /// A mipmapped array, released by `cuMipmappedArrayDestroy`.
    Mipmap(u64),
    /// A context made by `cuCtxCreate`, released by `cuCtxDestroy`.
    Context(u64),
    /// A device's primary context, released when its last retain is.
    Primary(u64),
    /// The graph allocations of an executable graph on one device, released
    /// by `cuGraphExecDestroy`.
    GraphExec(u64, u8),
}

impl Key {
    fn value(self) -> u64 {
        match self {
            Self::Pointer(v)
            | Self::Handle(v)
            | Self::Array(v)
            | Self::Mipmap(v)
            | Self::Context(v)
            | Self::Primary(v) => v,
            Self::GraphExec(v, dev) => v ^ u64::from(dev),
        }
    }

    fn shard(self) -> usize {
        (self.value() >> 9) as usize % SHARDS
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Keys of different kinds with the same value only collide; `Eq` tells them apart.
        state.write_u64(self.value());
    }
}

/// A multiplicative hash for addresses and handles: the default SipHash
/// costs more than the rest of an allocation's bookkeeping together.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value ^ (value >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Allocations = HashMap<Key, Allocation, BuildHasherDefault<AddressHasher>>;

/// Incremented in the child of every `fork` (a `pthread_atfork` handler), so
/// the allocation path notices a fork with one load instead of a `getpid`
/// system call.
static FORKS: AtomicU32 = AtomicU32::new(0);

extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

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

const SHARDS: usize = 16;

/// Accounting and enforcement for one process.
pub struct Enforcer {
    /// The compute limiter, when a device has a compute limit that the
    /// policy does not disable.
    compute: Option<Limiter>,
    limits: [u64; MAX_DEVICES],
    any_limit: bool,
    region: Option<Region>,
    /// `forks << 32 | slot + 1` when the slot was claimed (`forks` = [`FORKS`]
    /// then); 0 before the first claim. Another fork count means we are a
    /// fork child.
    owner: AtomicU64,
    /// The pid that claimed the slot, checked on slow paths (a raw `clone`
    /// child runs no fork handler).
    owner_pid: AtomicU32,
    /// Serialises slot claims within the process.
    claim: Mutex<()>,
    /// Pointer or handle → allocation, sharded.
    allocations: [Mutex<Allocations>; SHARDS],
    /// Memory pools and graph memory: what they hold beyond their live
    /// allocations.
    stores: Stores,
}

impl Enforcer {
    /// The compute limiter and the region it budgets in, if any.
    pub(crate) fn limiter(&self) -> Option<(&Limiter, &Region)> {
        Some((self.compute.as_ref()?, self.region.as_ref()?))
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
    pub fn limit(&self, dev: CUdevice) -> Option<u64> {
        let limit = *self.limits.get(usize::try_from(dev).ok()?)?;
        (limit != 0).then_some(limit)
    }

    /// Bytes the container holds on `dev`.
    pub fn used(&self, dev: CUdevice) -> u64 {
        match (&self.region, usize::try_from(dev)) {
            (Some(region), Ok(dev)) => region.used(dev),
            _ => 0,
        }
    }

    /// This process's slot, claimed on first use and again in a fork child
    /// (one load of the fork count on this path) or, from the slow paths, in a
    /// `clone` child (`check_pid`).
    fn slot(&self, region: &Region) -> Option<SlotId> {
        let owner = self.owner.load(Ordering::Acquire);
        if owner != 0 && owner >> 32 == u64::from(FORKS.load(Ordering::Relaxed)) {
            return slot_of(owner);
        }
        self.claim_slot(region, false)
    }

    /// Claims a slot unless this process already owns one; `check_pid`
    /// also compares the pid (a system call), for slow paths.
    fn claim_slot(&self, region: &Region, check_pid: bool) -> Option<SlotId> {
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
            for shard in &self.allocations {
                shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
            self.stores.clear();
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
        if let Err(rc) = self.reserve(region, slot, index, bytes) {
            // Slow path: a raw `clone` child still uses its parent's slot
            // until a pid check like this one.
            match self.claim_slot(region, true) {
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
        if self.resync_stores(dev) > 0 && region.try_reserve(slot, dev, bytes).is_ok() {
            return Ok(());
        }
        self.reserve_after_reclaim(region, slot, dev, bytes, over)
    }

    /// The end of [`Enforcer::reserve`]'s slow path: reclaim dead processes,
    /// retry once, else refuse.
    fn reserve_after_reclaim(
        &self,
        region: &Region,
        slot: SlotId,
        dev: usize,
        bytes: u64,
        over: tessera_vgpu_region::OverLimit,
    ) -> Result<(), CUresult> {
        let reclaimed = region.reclaim_dead();
        if reclaimed.slots > 0 {
            log!(
                INFO,
                "reclaimed {} bytes of {} exited processes",
                reclaimed.bytes,
                reclaimed.slots
            );
            if region.try_reserve(slot, dev, bytes).is_ok() {
                return Ok(());
            }
        }
        log!(
            INFO,
            "device {dev}: out of memory: {} bytes requested, {} of {} in use",
            over.requested,
            over.used,
            over.limit
        );
        Err(CUDA_ERROR_OUT_OF_MEMORY)
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
                self.store_give(id, a.bytes);
            }
        }
    }
}

fn slot_of(owner: u64) -> Option<SlotId> {
    // The slot index is stored + 1 in the low half; see `Enforcer::owner`.
    SlotId::from_index(((owner & 0xffff_ffff) as usize).checked_sub(1)?)
}
