//! Stream-ordered allocations and memory pools.
//!
//! Every pool is a store (`accounting/stores.rs`): an allocation is charged in
//! whole granules when it is enqueued, first from what the pool already
//! holds beyond its live allocations; a free leaves its bytes charged to the
//! pool, which keeps them (up to its release threshold) until the driver
//! gives them back; the charge then follows what the driver reports the pool
//! holds (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), read after every
//! allocation, free, trim and attribute change, after a synchronisation
//! (when the driver gives back what a pool holds beyond its release
//! threshold) while a pool is charged more than its live allocations, and
//! before an allocation is refused.
//!
//! `cuMemAllocAsync` allocates from the current pool of the current
//! context's device (`cuDeviceGetMemPool`); `cuMemAllocFromPoolAsync` from
//! the pool it names, on the device its `cuMemPoolCreate` named (pools made
//! elsewhere, e.g. a default pool from `cuDeviceGetDefaultMemPool`, count on
//! the current context's device). Allocations enqueued while the stream is
//! captured are graph allocations, charged when the graph is instantiated.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

use crate::accounting::keys::Key;
use crate::accounting::stores::StoreId;
use crate::driver::queries::current_device;
use crate::policy::memory::alloc::release_pointer;
use crate::policy::process::{State, enforcer_or_return, state};
use crate::sys::{
    CU_MEM_LOCATION_TYPE_DEVICE, CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_PER_THREAD,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUdevice, CUdeviceptr,
    CUevent, CUmemPoolProps, CUmemoryPool, CUresult, CUstream, granular,
};

/// Pools this process created: handle → the device they are on (`None`: a
/// location that is not device memory, e.g. host, which is not charged).
static POOLS: Mutex<Option<HashMap<u64, Option<CUdevice>>>> = Mutex::new(None);

/// Whether `stream` is being captured into a graph.
fn capturing(stream: CUstream, per_thread: bool) -> bool {
    let mut status: c_int = CU_STREAM_CAPTURE_STATUS_NONE;
    let rc = if per_thread {
        real!(cuStreamIsCapturing_ptsz(stream, &mut status))
    } else {
        real!(cuStreamIsCapturing(stream, &mut status))
    };
    rc == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// The driver entry points of one stream-ordered allocation.
struct Ordered<'a> {
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
    per_thread: bool,
    alloc: &'a dyn Fn() -> CUresult,
}

/// Charges one stream-ordered allocation from `pool` on `dev`.
///
/// # Safety
///
/// `o.dptr` is what `o.alloc` writes (the caller's argument).
unsafe fn charge(pool: CUmemoryPool, dev: CUdevice, o: Ordered<'_>) -> CUresult {
    let State::Enforcing(enforcer) = state() else {
        return (o.alloc)();
    };
    if capturing(o.stream, o.per_thread) {
        // A graph allocation node: nothing is allocated until the graph is.
        return (o.alloc)();
    }
    let id = StoreId::Pool(pool as u64);
    let taken = match enforcer.store_take(id, dev, granular(o.bytes as u64)) {
        Ok(Some(taken)) => taken,
        Ok(None) => return (o.alloc)(),
        Err(rc) => return rc,
    };
    let rc = (o.alloc)();
    if rc != CUDA_SUCCESS {
        enforcer.store_untake(taken);
        return rc;
    }
    // SAFETY: the driver succeeded, so `dptr` is valid and written.
    let ptr = unsafe { *o.dptr };
    enforcer.store_track(Key::Pointer(ptr), taken);
    if enforcer.store_resync(id).is_ok() {
        return CUDA_SUCCESS;
    }
    // The driver grew the pool by more than the allocation and the rest does
    // not fit: undo it, and give back what the pool holds unused.
    let stream = if o.stream.is_null() && o.per_thread {
        CU_STREAM_PER_THREAD
    } else {
        o.stream
    };
    release_pointer(ptr, || real!(cuMemFreeAsync(ptr, stream)));
    real!(cuStreamSynchronize(stream));
    real!(cuMemPoolTrimTo(pool, 0));
    let _ = enforcer.store_resync(id);
    CUDA_ERROR_OUT_OF_MEMORY
}

/// The pool a stream-ordered allocation comes from and the device it is
/// charged to: `pool`, on the device its `cuMemPoolCreate` named (or the
/// current context's device, for a pool made elsewhere), or without one the
/// current pool of the current context's device. `None`: a pool that is not
/// device memory, not charged.
fn pool_device(pool: Option<CUmemoryPool>) -> Result<Option<(CUmemoryPool, CUdevice)>, CUresult> {
    let Some(pool) = pool else {
        let dev = current_device()?;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        let rc = real!(cuDeviceGetMemPool(&mut pool, dev));
        return if rc == CUDA_SUCCESS {
            Ok(Some((pool, dev)))
        } else {
            Err(rc)
        };
    };
    let known = POOLS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|pools| pools.get(&(pool as u64)).copied());
    match known {
        Some(Some(dev)) => Ok(Some((pool, dev))),
        // Not device memory.
        Some(None) => Ok(None),
        None => Ok(Some((pool, current_device()?))),
    }
}

/// `cuMemAllocAsync`, `cuMemAllocFromPoolAsync` (`pool`) and their `_ptsz`
/// variants, charged to the pool [`pool_device`] finds.
///
/// # Safety
///
/// `dptr` is what `alloc` writes.
unsafe fn alloc_ordered(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    per_thread: bool,
    alloc: &dyn Fn() -> CUresult,
) -> CUresult {
    enforcer_or_return!(alloc());
    let (pool, dev) = match pool_device(pool) {
        Ok(Some(found)) => found,
        Ok(None) => return alloc(),
        Err(rc) => return rc,
    };
    let ordered = Ordered {
        dptr,
        bytes,
        stream,
        per_thread,
        alloc,
    };
    // SAFETY: `dptr` is what `alloc` writes, per the caller.
    unsafe { charge(pool, dev, ordered) }
}

/// `cuMemAllocAsync`, charged when it is enqueued (see the module).
///
/// # Safety
///
/// `dptr` as for `cuMemAllocAsync`.
pub(crate) unsafe fn mem_alloc_async(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    let alloc = || real!(cuMemAllocAsync(dptr, bytesize, stream));
    // SAFETY: `dptr` is the caller's, which `alloc` writes.
    unsafe { alloc_ordered(dptr, bytesize, None, stream, false, &alloc) }
}

/// `cuMemAllocAsync_ptsz` (per-thread default stream), calling the driver's
/// own `_ptsz` function.
///
/// # Safety
///
/// `dptr` as for `cuMemAllocAsync`.
pub(crate) unsafe fn mem_alloc_async_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    let alloc = || real!(cuMemAllocAsync_ptsz(dptr, bytesize, stream));
    // SAFETY: `dptr` is the caller's, which `alloc` writes.
    unsafe { alloc_ordered(dptr, bytesize, None, stream, true, &alloc) }
}

/// `cuMemAllocFromPoolAsync`, charged to the pool's device (see the module).
///
/// # Safety
///
/// `dptr` as for `cuMemAllocFromPoolAsync`.
pub(crate) unsafe fn mem_alloc_from_pool_async(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let alloc = || real!(cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream));
    // SAFETY: `dptr` is the caller's, which `alloc` writes.
    unsafe { alloc_ordered(dptr, bytesize, Some(pool), stream, false, &alloc) }
}

/// `cuMemAllocFromPoolAsync_ptsz`.
///
/// # Safety
///
/// `dptr` as for `cuMemAllocFromPoolAsync`.
pub(crate) unsafe fn mem_alloc_from_pool_async_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let alloc = || real!(cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream));
    // SAFETY: `dptr` is the caller's, which `alloc` writes.
    unsafe { alloc_ordered(dptr, bytesize, Some(pool), stream, true, &alloc) }
}

/// `cuMemFreeAsync`: enqueues the free; the bytes stay charged to the pool
/// until the driver says it gave them back.
///
/// # Safety
///
/// None beyond `cuMemFreeAsync`'s.
pub(crate) unsafe fn mem_free_async(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    release_pointer(dptr, || real!(cuMemFreeAsync(dptr, stream)))
}

/// `cuMemFreeAsync_ptsz`.
///
/// # Safety
///
/// None beyond `cuMemFreeAsync`'s.
pub(crate) unsafe fn mem_free_async_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    release_pointer(dptr, || real!(cuMemFreeAsync_ptsz(dptr, stream)))
}

/// `cuMemPoolCreate`: remembers the device the pool is on.
///
/// # Safety
///
/// `pool` and `props` as for `cuMemPoolCreate`.
pub(crate) unsafe fn pool_create(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemPoolCreate(pool, props)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(_)) = (rc, state()) {
        // SAFETY: the driver accepted `props` and wrote `pool`.
        let (created, location) = unsafe { (*pool, (*props).location) };
        let dev = (location.type_ == CU_MEM_LOCATION_TYPE_DEVICE).then_some(location.id);
        POOLS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(created as u64, dev);
    }
    rc
}

/// `cuMemPoolDestroy`: the pool's charge goes now if it has no live
/// allocations, else with the last of them (the driver keeps its memory
/// until then).
///
/// # Safety
///
/// None beyond `cuMemPoolDestroy`'s.
pub(crate) unsafe fn pool_destroy(pool: CUmemoryPool) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemPoolDestroy(pool)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state()) {
        enforcer.store_close(StoreId::Pool(pool as u64));
        if let Some(pools) = POOLS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            pools.remove(&(pool as u64));
        }
    }
    rc
}

/// `cuMemPoolTrimTo`: the pool's charge follows what it still holds.
///
/// # Safety
///
/// None beyond `cuMemPoolTrimTo`'s.
pub(crate) unsafe fn pool_trim_to(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemPoolTrimTo(pool, min_bytes_to_keep)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state()) {
        let _ = enforcer.store_resync(StoreId::Pool(pool as u64));
    }
    rc
}

/// `cuMemPoolSetAttribute`: after a change (e.g. of the release threshold)
/// the pool's charge follows what it holds.
///
/// # Safety
///
/// `value` as for `cuMemPoolSetAttribute`.
pub(crate) unsafe fn pool_set_attribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut std::ffi::c_void,
) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuMemPoolSetAttribute(pool, attr, value)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state()) {
        let _ = enforcer.store_resync(StoreId::Pool(pool as u64));
    }
    rc
}

/// Runs a synchronisation, then lets pools' charges follow what the driver
/// gave back (it releases pool memory beyond the release threshold at
/// stream, event and context synchronisation).
fn synchronized(call: impl FnOnce() -> CUresult) -> CUresult {
    if matches!(state(), State::Refused) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    let rc = call();
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state()) {
        enforcer.stores_synchronized();
    }
    rc
}

/// `cuStreamSynchronize`.
///
/// # Safety
///
/// None beyond `cuStreamSynchronize`'s.
pub(crate) unsafe fn stream_synchronize(stream: CUstream) -> CUresult {
    synchronized(|| real!(cuStreamSynchronize(stream)))
}

/// `cuStreamSynchronize_ptsz`.
///
/// # Safety
///
/// None beyond `cuStreamSynchronize`'s.
pub(crate) unsafe fn stream_synchronize_ptsz(stream: CUstream) -> CUresult {
    synchronized(|| real!(cuStreamSynchronize_ptsz(stream)))
}

/// `cuCtxSynchronize`.
///
/// # Safety
///
/// None beyond `cuCtxSynchronize`'s.
pub(crate) unsafe fn ctx_synchronize() -> CUresult {
    synchronized(|| real!(cuCtxSynchronize()))
}

/// `cuEventSynchronize`.
///
/// # Safety
///
/// None beyond `cuEventSynchronize`'s.
pub(crate) unsafe fn event_synchronize(event: CUevent) -> CUresult {
    synchronized(|| real!(cuEventSynchronize(event)))
}
