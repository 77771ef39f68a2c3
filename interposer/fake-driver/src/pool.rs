//! Memory pools: `cuMemPoolCreate`, `cuMemPoolDestroy`, `cuMemPoolTrimTo`,
//! `cuMemPoolSetAttribute`, `cuMemPoolGetAttribute`,
//! `cuDeviceGetDefaultMemPool`, `cuDeviceGetMemPool`, `cuDeviceSetMemPool`,
//! and the allocations made from them.
//!
//! Stream-ordered allocations themselves (`cuMemAllocAsync`,
//! `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`) are in `ordered.rs`.
//!
//! A pool *reserves* device memory in whole granules and keeps what its
//! allocations free, as a real pool does: an allocation uses the pool's
//! unused reserved bytes first (no fragmentation is modelled) and grows the
//! reservation by the rest. Allocations and frees are immediate (the fake
//! has no stream-ordered execution); as on a real driver, a pool gives back
//! what it reserves beyond its used bytes and its release threshold
//! (default 0) only at the next stream, event or context synchronisation
//! (`cuStreamSynchronize`, `cuCtxSynchronize`, `cuEventSynchronize`), so
//! freed memory stays reserved until then. `cuMemPoolTrimTo`
//! gives back unused memory down to the bytes asked to keep. Every device has
//! a default pool, its current pool until `cuDeviceSetMemPool`.
//! `FAKE_CUDA_POOL_CHUNK` (bytes) makes pools grow in larger chunks than
//! their allocations need, as some drivers do. On a stream being captured,
//! `cuMemAllocAsync` and `cuMemFreeAsync` add graph nodes (`exec/graph.rs`, from `ordered.rs`).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::base::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUdevice, CUdeviceptr, CUresult,
    GRANULARITY, granular, guard, write,
};
use crate::devices::{device, initialized, physical};
use crate::memory::new_address;

const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_int = 8;

pub(crate) type CUmemoryPool = *mut c_void;

/// `CUmemPoolProps` (88 bytes), as far as the fake reads it.
#[repr(C)]
pub struct PoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_security_attributes: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

const _: () = assert!(size_of::<PoolProps>() == 88);

struct Pool {
    dev: usize,
    /// Device memory the pool holds, a multiple of the granularity.
    reserved: u64,
    /// Of which its live allocations use this much.
    used: u64,
    reserved_high: u64,
    used_high: u64,
    threshold: u64,
    /// A device's default pool, which cannot be destroyed.
    default: bool,
    /// Destroyed with live allocations: freed with the last of them.
    destroyed: bool,
}

impl Pool {
    fn new(dev: usize, default: bool) -> Self {
        Self {
            dev,
            reserved: 0,
            used: 0,
            reserved_high: 0,
            used_high: 0,
            threshold: 0,
            default,
            destroyed: false,
        }
    }

    /// Gives back unused reserved memory beyond `keep` bytes.
    fn release_beyond(&mut self, keep: u64) -> Result<(), CUresult> {
        let keep = granular(keep)
            .unwrap_or(u64::MAX)
            .min(self.reserved)
            .max(self.used);
        physical()?.release(self.dev, self.reserved - keep);
        self.reserved = keep;
        Ok(())
    }
}

#[derive(Default)]
struct Pools {
    pools: HashMap<usize, Pool>,
    /// Each device's default pool, once asked for.
    defaults: HashMap<usize, usize>,
    /// Each device's current pool, when set.
    current: HashMap<usize, usize>,
    /// Stream-ordered allocations: address → (pool, bytes).
    pointers: HashMap<CUdeviceptr, (usize, u64)>,
}

impl Pools {
    fn default_pool(&mut self, dev: usize) -> usize {
        if let Some(&pool) = self.defaults.get(&dev) {
            return pool;
        }
        let pool = new_handle();
        self.pools.insert(pool, Pool::new(dev, true));
        self.defaults.insert(dev, pool);
        pool
    }

    fn current_pool(&mut self, dev: usize) -> usize {
        match self.current.get(&dev) {
            Some(&pool) => pool,
            None => self.default_pool(dev),
        }
    }

    fn live(&mut self, pool: CUmemoryPool) -> Result<&mut Pool, CUresult> {
        self.pools
            .get_mut(&(pool as usize))
            .filter(|p| !p.destroyed)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }
}

static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

/// `FAKE_CUDA_POOL_CHUNK`: pools grow in multiples of this many bytes
/// (default: the granularity, i.e. by what the allocation needs).
fn chunk() -> u64 {
    static CHUNK: OnceLock<u64> = OnceLock::new();
    *CHUNK.get_or_init(|| {
        std::env::var("FAKE_CUDA_POOL_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&c| c > 0)
            .and_then(granular)
            .unwrap_or(GRANULARITY)
    })
}
static NEXT_POOL: AtomicU64 = AtomicU64::new(0x6000_0000);

fn new_handle() -> usize {
    NEXT_POOL.fetch_add(16, Ordering::Relaxed) as usize
}

fn with_pools<T>(body: impl FnOnce(&mut Pools) -> Result<T, CUresult>) -> Result<T, CUresult> {
    body(
        POOLS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Pools::default),
    )
}

/// Allocates `bytes` from `pool` (NULL: the current pool of device `dev`),
/// immediately: the pool's unused reserved bytes first, then it grows.
pub(crate) fn allocate(
    dev: usize,
    bytes: u64,
    pool: CUmemoryPool,
) -> Result<CUdeviceptr, CUresult> {
    let need = granular(bytes).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    with_pools(|pools| {
        let handle = if pool.is_null() {
            pools.current_pool(dev)
        } else {
            pool as usize
        };
        let p = pools.live(handle as CUmemoryPool)?;
        let unused = p.reserved - p.used;
        if need > unused {
            let grow = (need - unused).next_multiple_of(chunk());
            if !physical()?.reserve(p.dev, grow) {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            p.reserved += grow;
            p.reserved_high = p.reserved_high.max(p.reserved);
        }
        p.used += need;
        p.used_high = p.used_high.max(p.used);
        let address = new_address(need);
        pools.pointers.insert(address, (handle, need));
        Ok(address)
    })
}

/// Frees `dptr` if it is a stream-ordered allocation: `Ok(false)` if not.
pub(crate) fn free_pointer(dptr: CUdeviceptr) -> Result<bool, CUresult> {
    with_pools(|pools| {
        let Some((handle, bytes)) = pools.pointers.remove(&dptr) else {
            return Ok(false);
        };
        let Some(p) = pools.pools.get_mut(&handle) else {
            return Ok(true);
        };
        p.used -= bytes;
        if p.destroyed && p.used == 0 {
            physical()?.release(p.dev, p.reserved);
            pools.pools.remove(&handle);
        }
        Ok(true)
    })
}

/// A synchronisation (stream, context or event): every pool gives back
/// what it reserves beyond its used bytes and its release threshold.
pub(crate) fn synchronized() -> Result<(), CUresult> {
    with_pools(|pools| {
        for p in pools.pools.values_mut() {
            let threshold = p.threshold;
            p.release_beyond(threshold)?;
        }
        Ok(())
    })
}

/// `cuMemPoolCreate`: a pinned pool on a device location.
///
/// # Safety
///
/// `pool` is NULL or valid for writes; `props` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const PoolProps,
) -> CUresult {
    guard(|| {
        initialized()?;
        // SAFETY: NULL or valid per the caller.
        let props = unsafe { props.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if props.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED
            || props.location_type != CU_MEM_LOCATION_TYPE_DEVICE
            || pool.is_null()
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = device(props.location_id)?;
        let handle = with_pools(|pools| {
            let handle = new_handle();
            pools.pools.insert(handle, Pool::new(dev, false));
            Ok(handle)
        })?;
        // SAFETY: checked non-NULL above.
        unsafe { write(pool, handle as CUmemoryPool) }
    })
}

/// `cuMemPoolDestroy`: a pool with live allocations goes with the last.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        initialized()?;
        with_pools(|pools| {
            let p = pools.live(pool)?;
            if p.default {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            if p.used > 0 {
                p.destroyed = true;
                return Ok(());
            }
            physical()?.release(p.dev, p.reserved);
            pools.pools.remove(&(pool as usize));
            pools
                .current
                .retain(|_, &mut current| current != pool as usize);
            Ok(())
        })
    })
}

/// `cuMemPoolTrimTo`: gives back unused memory until the pool reserves at
/// most `min_bytes_to_keep` (rounded up to the granularity).
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    guard(|| {
        initialized()?;
        with_pools(|pools| pools.live(pool)?.release_beyond(min_bytes_to_keep as u64))
    })
}

/// `cuMemPoolSetAttribute`: the release threshold, the reuse flags (ignored)
/// and resets of the high-water marks.
///
/// # Safety
///
/// `value` is NULL or valid for reads of the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        initialized()?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with_pools(|pools| {
            let p = pools.live(pool)?;
            match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                    ..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {}
                // SAFETY: a cuuint64_t for these attributes, per the caller.
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.threshold = unsafe { *value.cast::<u64>() },
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => p.used_high = p.used,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            Ok(())
        })
    })
}

/// `cuMemPoolGetAttribute`.
///
/// # Safety
///
/// `value` is NULL or valid for writes of the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        initialized()?;
        let answer = with_pools(|pools| {
            let p = pools.live(pool)?;
            Ok(match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                    ..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => None,
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => Some(p.threshold),
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => Some(p.reserved),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => Some(p.reserved_high),
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => Some(p.used),
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => Some(p.used_high),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            })
        })?;
        // SAFETY: the caller's pointer, of the attribute's type, NULL-checked by `write`.
        unsafe {
            match answer {
                Some(bytes) => write(value.cast::<u64>(), bytes),
                None => write(value.cast::<c_int>(), 1),
            }
        }
    })
}

/// `cuDeviceGetDefaultMemPool`.
///
/// # Safety
///
/// `pool` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let handle = with_pools(|pools| Ok(pools.default_pool(dev)))?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(pool, handle as CUmemoryPool) }
    })
}

/// `cuDeviceGetMemPool`: the device's current pool.
///
/// # Safety
///
/// `pool` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let handle = with_pools(|pools| Ok(pools.current_pool(dev)))?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(pool, handle as CUmemoryPool) }
    })
}

/// `cuDeviceSetMemPool`: a pool of that device becomes its current pool.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        with_pools(|pools| {
            if pools.live(pool)?.dev != dev {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            pools.current.insert(dev, pool as usize);
            Ok(())
        })
    })
}
