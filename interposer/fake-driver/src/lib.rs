//! A fake CUDA driver, built as `libcuda.so` with soname `libcuda.so.1`, for
//! testing the interposer on machines without a GPU.
//!
//! It implements the driver API the interposer and its tests call (devices,
//! contexts, device memory, VMM physical allocations, address ranges and
//! mappings (`vmm.rs`), memory pools and stream-ordered allocation
//! (`pool.rs`: immediate, a pool keeps freed memory up to its release
//! threshold), CUDA arrays (`array.rs`), `cuGetProcAddress(_v2)` with versioned names and
//! per-thread-stream flags, and execution on a simulated GPU timeline
//! (`exec.rs`: streams, events, kernel and graph launches, stream capture))
//! with the real driver's argument checks and error codes. Device memory is
//! bookkeeping only: pointers are unique addresses, never dereferenceable.
//!
//! "Physical" device state is shared between processes through a small file,
//! so several processes see one device, as they would see one GPU:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `FAKE_CUDA_STATE` | file holding the devices' physical usage | unset: private to the process (and its forks) |
//! | `FAKE_CUDA_DEVICE_COUNT` | number of devices, 1 to 16 | 1 |
//! | `FAKE_CUDA_DEVICE_MEMORY` | bytes per device (`k`, `m`, `g` suffixes) | `80g` |
//! | `FAKE_CUDA_DRIVER_VERSION` | what `cuDriverGetVersion` reports | 12090 |
//! | `FAKE_CUDA_NS_PER_BLOCK` | how long each block of a launched grid occupies the device, ns | 1000 |
//! | `FAKE_CUDA_CONTEXT_MEMORY` | device memory each context takes (`k`, `m`, `g` suffixes) | 0 |
//! | `FAKE_CUDA_POOL_CHUNK` | memory pools grow in multiples of this many bytes | 2 MiB (the granularity) |
//! | `FAKE_CUDA_FAIL`, `FAKE_CUDA_LATENCY_US` | fault and latency injection (`inject.rs`) | none |
//!
//! The device count and memory are fixed by the first process that creates
//! the state file. Memory of a process that dies without freeing stays used
//! (unlike a real driver, which frees it at process exit).
//!
//! `tesseraFakeStats(dev, *used, *peak)` reports a device's physical usage
//! and high-water mark, for tests that check the interposer never let a
//! container overcommit.

#![allow(unsafe_code)] // a C ABI library; every block carries a SAFETY comment
#![allow(non_snake_case)] // exports carry the driver's names
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

mod array;
mod context;
mod device;
mod exec;
mod inject;
mod pool;
mod vmm;

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use array::*;
use context::*;
use device::*;
use exec::*;
use fake_gpu::physical::Physical;
use pool::*;
use vmm::*;

type CUresult = c_int;
type CUdevice = c_int;
type CUdeviceptr = u64;
type CUcontext = *mut c_void;

const CUDA_SUCCESS: CUresult = 0;
const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;
const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `cuGetProcAddress` flag: resolve to the per-thread-default-stream (`_ptsz`) variant.
const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// The allocation granularity of real NVIDIA GPUs: `cuMemCreate` sizes must
/// be multiples of it, and `cuMemAlloc`, `cuMemAllocManaged` and
/// `cuMemAllocPitch` take whole multiples of it from the device.
pub(crate) const GRANULARITY: u64 = 2 << 20;

/// `cuMemAllocPitch` aligns rows to this many bytes.
const PITCH_ALIGNMENT: u64 = 512;

static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// Next device address handed out by this process.
static NEXT_ADDRESS: AtomicU64 = AtomicU64::new(0x7f00_0000_0000);
/// Live contexts (their addresses) → device.
static CONTEXTS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// Live allocations of this process: address → (device, bytes).
static ALLOCATIONS: Mutex<Option<HashMap<CUdeviceptr, (usize, u64)>>> = Mutex::new(None);
/// Calls of `_ptsz` variants in this process (see `tesseraFakePerThreadCalls`).
pub(crate) static PER_THREAD_CALLS: AtomicU64 = AtomicU64::new(0);
static PHYSICAL: OnceLock<Result<Physical, String>> = OnceLock::new();

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// A context: which device it belongs to.
struct Context {
    device: usize,
    /// `cuCtxGetId`: unique for the process's life, never reused.
    id: u64,
    /// Device memory it takes (`FAKE_CUDA_CONTEXT_MEMORY`).
    bytes: u64,
    /// A device's primary context (`context.rs`), which `cuCtxDestroy` refuses.
    primary: bool,
}

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

fn guard(body: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(rc)) => rc,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

fn physical() -> Result<&'static Physical, CUresult> {
    match PHYSICAL.get_or_init(Physical::from_env) {
        Ok(physical) => Ok(physical),
        Err(message) => {
            eprintln!("fake libcuda: {message}");
            Err(CUDA_ERROR_UNKNOWN)
        }
    }
}

fn initialized() -> Result<(), CUresult> {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_INITIALIZED)
    }
}

fn device(dev: CUdevice) -> Result<usize, CUresult> {
    initialized()?;
    let count = physical()?.device_count();
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < count)
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

fn current_device() -> Result<usize, CUresult> {
    initialized()?;
    let ctx = CURRENT.get();
    if ctx == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    // SAFETY: CURRENT only ever holds a live context (cuCtxDestroy clears it
    // on the destroying thread; other threads' stale use is a caller bug the
    // real driver does not catch either).
    Ok(unsafe { &*(ctx as *const Context) }.device)
}

/// Writes `value` through `out`, or fails with `CUDA_ERROR_INVALID_VALUE`
/// when it is NULL.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
unsafe fn write<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid for writes per the caller.
    unsafe { out.write(value) };
    Ok(())
}

/// `bytes` rounded up to the allocation granularity, `None` on overflow.
pub(crate) fn granular(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(GRANULARITY)
}

/// A new device address range of `bytes` (never reused in this process).
pub(crate) fn new_address(bytes: u64) -> CUdeviceptr {
    let span = bytes.div_ceil(256) * 256 + 256;
    NEXT_ADDRESS.fetch_add(span, Ordering::Relaxed)
}

/// A device allocation on the current context's device: takes whole
/// granules, as the real driver does (small allocations do not share them).
fn allocate(dptr: *mut CUdeviceptr, bytes: u64) -> Result<(), CUresult> {
    let dev = current_device()?;
    if dptr.is_null() || bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = granular(bytes).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    if !physical()?.reserve(dev, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let address = new_address(bytes);
    ALLOCATIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(address, (dev, bytes));
    // SAFETY: checked non-NULL above; valid for writes per the C contract.
    unsafe { dptr.write(address) };
    Ok(())
}

/// `cuInit`.
///
/// # Safety
///
/// Safe to call with any value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    inject::guard("cuInit", || {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        physical()?;
        INITIALIZED.store(true, Ordering::Release);
        Ok(())
    })
}

/// `cuDriverGetVersion`.
///
/// # Safety
///
/// `version` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    let reported = std::env::var("FAKE_CUDA_DRIVER_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12090);
    // SAFETY: the caller's pointer, NULL-checked by `write`.
    guard(|| unsafe { write(version, reported) })
}

/// `cuDeviceGetCount`.
///
/// # Safety
///
/// `count` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        initialized()?;
        let n = physical()?.device_count() as c_int;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(count, n) }
    })
}

/// `cuDeviceGet`.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(out: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        let dev = device(ordinal)?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, dev as CUdevice) }
    })
}

/// `cuDeviceGetName`.
///
/// # Safety
///
/// `name` is NULL or valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let text = format!("Tessera Fake GPU {dev}");
        let n = text.len().min(len - 1);
        // SAFETY: `name` is valid for `len` bytes and n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), name, n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

/// `cuDeviceTotalMem_v2`.
///
/// # Safety
///
/// `bytes` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let total = physical()?.total(dev) as usize;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(bytes, total) }
    })
}

/// `cuCtxCreate_v2`: creates a context and makes it current.
///
/// # Safety
///
/// `pctx` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    inject::guard("cuCtxCreate_v2", || context::create_current(pctx, dev))
}

/// `cuCtxDestroy_v2`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(|| {
        initialized()?;
        context::destroy(ctx as usize, false)
    })
}

/// `cuCtxSetCurrent`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        initialized()?;
        let ctx = ctx as usize;
        let known = ctx == 0
            || CONTEXTS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|set| set.contains(&ctx));
        if !known {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        CURRENT.set(ctx);
        Ok(())
    })
}

/// `cuCtxGetCurrent`.
///
/// # Safety
///
/// `pctx` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        initialized()?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(pctx, CURRENT.get() as CUcontext) }
    })
}

/// `cuCtxGetId` (CUDA 12.0): a context's unique id; NULL means the current one.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, out: *mut u64) -> CUresult {
    guard(|| {
        initialized()?;
        let ctx = if ctx.is_null() {
            CURRENT.get()
        } else {
            ctx as usize
        };
        let known = ctx != 0
            && CONTEXTS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|set| set.contains(&ctx));
        if !known {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        // SAFETY: a live context (in the set), created by cuCtxCreate_v2.
        let id = unsafe { &*(ctx as *const Context) }.id;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, id) }
    })
}

/// `cuCtxGetDevice`.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(out: *mut CUdevice) -> CUresult {
    inject::guard("cuCtxGetDevice", || {
        let dev = current_device()?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, dev as CUdevice) }
    })
}

/// `cuMemAlloc_v2`.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    inject::guard("cuMemAlloc_v2", || allocate(dptr, bytesize as u64))
}

/// `cuMemAllocManaged`: `flags` must be `CU_MEM_ATTACH_GLOBAL` (1) or
/// `CU_MEM_ATTACH_HOST` (2); counted as device memory.
///
/// # Safety
///
/// `dptr` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    inject::guard("cuMemAllocManaged", || {
        if flags != 1 && flags != 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        allocate(dptr, bytesize as u64)
    })
}

/// `cuMemAllocPitch_v2`: rows are aligned to 512 bytes; `element_size` must
/// be 4, 8 or 16.
///
/// # Safety
///
/// `dptr` and `pitch` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    inject::guard("cuMemAllocPitch_v2", || {
        current_device()?;
        if pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&element_size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = (width as u64).div_ceil(PITCH_ALIGNMENT) * PITCH_ALIGNMENT;
        let bytes = row
            .checked_mul(height as u64)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        allocate(dptr, bytes)?;
        // SAFETY: checked non-NULL above.
        unsafe { pitch.write(row as usize) };
        Ok(())
    })
}

/// Frees a device pointer: a pool's (stream-ordered) or a plain allocation.
pub(crate) fn free(dptr: CUdeviceptr) -> Result<(), CUresult> {
    initialized()?;
    if pool::free_pointer(dptr)? || exec::is_graph_pointer(dptr) {
        return Ok(());
    }
    let (dev, bytes) = ALLOCATIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|map| map.remove(&dptr))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    physical()?.release(dev, bytes);
    Ok(())
}

/// `cuMemFree_v2`.
///
/// # Safety
///
/// Safe with any value: unknown addresses are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    inject::guard("cuMemFree_v2", || free(dptr))
}

/// Not a CUDA function: how many times this process called a `_ptsz`
/// variant, so tests can check per-thread-stream semantics survive hooking.
///
/// # Safety
///
/// Safe to call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tesseraFakePerThreadCalls() -> u64 {
    PER_THREAD_CALLS.load(Ordering::Relaxed)
}

/// `cuMemGetInfo_v2`: the current device's physical free and total bytes,
/// across every process using the state file.
///
/// # Safety
///
/// `free` and `total` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    inject::guard("cuMemGetInfo_v2", || {
        let dev = current_device()?;
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let physical = physical()?;
        let all = physical.total(dev);
        // SAFETY: both checked non-NULL above.
        unsafe {
            free.write(all.saturating_sub(physical.used(dev)) as usize);
            total.write(all as usize);
        }
        Ok(())
    })
}

/// Not a CUDA function: a device's physical usage and its high-water mark.
///
/// # Safety
///
/// `used` and `peak` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tesseraFakeStats(
    dev: CUdevice,
    used: *mut u64,
    peak: *mut u64,
) -> CUresult {
    guard(|| {
        let physical = physical()?;
        let dev = usize::try_from(dev)
            .ok()
            .filter(|&d| d < physical.device_count())
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        // SAFETY: the caller's pointers, NULL-checked by `write`.
        unsafe {
            write(used, physical.used(dev))?;
            write(peak, physical.peak(dev))
        }
    })
}

/// A versioned driver symbol: available to callers built for `since` or later.
struct Versioned {
    since: c_int,
    address: *mut c_void,
}

/// The versions of a base name, oldest first, as `cuGetProcAddress` sees them.
fn versions(name: &[u8]) -> Vec<Versioned> {
    macro_rules! v {
        ($since:expr, $f:ident) => {
            Versioned {
                since: $since,
                address: $f as *mut c_void,
            }
        };
    }
    match name {
        b"cuInit" => vec![v!(2000, cuInit)],
        b"cuDriverGetVersion" => vec![v!(2020, cuDriverGetVersion)],
        b"cuDeviceGet" => vec![v!(2000, cuDeviceGet)],
        b"cuDeviceGetCount" => vec![v!(2000, cuDeviceGetCount)],
        b"cuDeviceGetName" => vec![v!(2000, cuDeviceGetName)],
        b"cuDeviceGetUuid" => vec![v!(9020, cuDeviceGetUuid), v!(11040, cuDeviceGetUuid_v2)],
        b"cuDeviceTotalMem" => vec![v!(3020, cuDeviceTotalMem_v2)],
        b"cuCtxCreate" => vec![
            v!(3020, cuCtxCreate_v2),
            v!(11040, cuCtxCreate_v3),
            v!(12050, cuCtxCreate_v4),
        ],
        b"cuDevicePrimaryCtxRetain" => vec![v!(7000, cuDevicePrimaryCtxRetain)],
        b"cuDevicePrimaryCtxRelease" => vec![v!(11000, cuDevicePrimaryCtxRelease_v2)],
        b"cuCtxDestroy" => vec![v!(4000, cuCtxDestroy_v2)],
        b"cuCtxSetCurrent" => vec![v!(4000, cuCtxSetCurrent)],
        b"cuCtxGetCurrent" => vec![v!(4000, cuCtxGetCurrent)],
        b"cuCtxGetDevice" => vec![v!(2000, cuCtxGetDevice)],
        b"cuCtxGetId" => vec![v!(12000, cuCtxGetId)],
        b"cuMemAlloc" => vec![v!(3020, cuMemAlloc_v2)],
        b"cuMemAllocManaged" => vec![v!(6000, cuMemAllocManaged)],
        b"cuMemAllocPitch" => vec![v!(3020, cuMemAllocPitch_v2)],
        b"cuMemFree" => vec![v!(3020, cuMemFree_v2)],
        b"cuMemGetInfo" => vec![v!(3020, cuMemGetInfo_v2)],
        b"cuMemGetAllocationGranularity" => vec![v!(10020, cuMemGetAllocationGranularity)],
        b"cuMemCreate" => vec![v!(10020, cuMemCreate)],
        b"cuMemRelease" => vec![v!(10020, cuMemRelease)],
        b"cuMemRetainAllocationHandle" => vec![v!(11000, cuMemRetainAllocationHandle)],
        b"cuMemAddressReserve" => vec![v!(10020, cuMemAddressReserve)],
        b"cuMemAddressFree" => vec![v!(10020, cuMemAddressFree)],
        b"cuMemMap" => vec![v!(10020, cuMemMap)],
        b"cuMemUnmap" => vec![v!(10020, cuMemUnmap)],
        b"cuMemAllocAsync" => vec![v!(11020, cuMemAllocAsync)],
        b"cuMemFreeAsync" => vec![v!(11020, cuMemFreeAsync)],
        b"cuMemAllocFromPoolAsync" => vec![v!(11020, cuMemAllocFromPoolAsync)],
        b"cuGraphCreate" => vec![v!(10000, cuGraphCreate)],
        b"cuGraphAddMemAllocNode" => vec![v!(11040, cuGraphAddMemAllocNode)],
        b"cuGraphAddMemFreeNode" => vec![v!(11040, cuGraphAddMemFreeNode)],
        b"cuGraphGetNodes" => vec![v!(10000, cuGraphGetNodes)],
        b"cuGraphNodeGetType" => vec![v!(10000, cuGraphNodeGetType)],
        b"cuGraphMemAllocNodeGetParams" => vec![v!(11040, cuGraphMemAllocNodeGetParams)],
        b"cuGraphInstantiate" => vec![
            v!(10000, cuGraphInstantiate_v2),
            v!(12000, cuGraphInstantiateWithFlags),
        ],
        b"cuGraphInstantiateWithParams" => vec![v!(12000, cuGraphInstantiateWithParams)],
        b"cuDeviceGraphMemTrim" => vec![v!(11040, cuDeviceGraphMemTrim)],
        b"cuDeviceGetGraphMemAttribute" => vec![v!(11040, cuDeviceGetGraphMemAttribute)],
        b"cuArrayCreate" => vec![v!(3020, cuArrayCreate_v2)],
        b"cuArray3DCreate" => vec![v!(3020, cuArray3DCreate_v2)],
        b"cuMipmappedArrayCreate" => vec![v!(5000, cuMipmappedArrayCreate)],
        b"cuArrayDestroy" => vec![v!(2000, cuArrayDestroy)],
        b"cuMipmappedArrayDestroy" => vec![v!(5000, cuMipmappedArrayDestroy)],
        b"cuMemPoolCreate" => vec![v!(11020, cuMemPoolCreate)],
        b"cuMemPoolDestroy" => vec![v!(11020, cuMemPoolDestroy)],
        b"cuMemPoolTrimTo" => vec![v!(11020, cuMemPoolTrimTo)],
        b"cuMemPoolSetAttribute" => vec![v!(11020, cuMemPoolSetAttribute)],
        b"cuMemPoolGetAttribute" => vec![v!(11020, cuMemPoolGetAttribute)],
        b"cuDeviceGetDefaultMemPool" => vec![v!(11020, cuDeviceGetDefaultMemPool)],
        b"cuDeviceGetMemPool" => vec![v!(11020, cuDeviceGetMemPool)],
        b"cuDeviceSetMemPool" => vec![v!(11020, cuDeviceSetMemPool)],
        b"cuGetProcAddress" => vec![v!(11030, cuGetProcAddress), v!(12000, cuGetProcAddress_v2)],
        b"cuLaunchKernel" => vec![v!(4000, cuLaunchKernel)],
        b"cuLaunchKernelEx" => vec![v!(11080, cuLaunchKernelEx)],
        b"cuLaunchCooperativeKernel" => vec![v!(9000, cuLaunchCooperativeKernel)],
        b"cuGraphLaunch" => vec![v!(10000, cuGraphLaunch)],
        b"cuStreamCreate" => vec![v!(2000, cuStreamCreate)],
        b"cuStreamDestroy" => vec![v!(4000, cuStreamDestroy_v2)],
        b"cuStreamSynchronize" => vec![v!(2000, cuStreamSynchronize)],
        b"cuStreamBeginCapture" => vec![v!(10010, cuStreamBeginCapture_v2)],
        b"cuStreamEndCapture" => vec![v!(10000, cuStreamEndCapture)],
        b"cuStreamIsCapturing" => vec![v!(10000, cuStreamIsCapturing)],
        b"cuGraphInstantiateWithFlags" => vec![v!(11040, cuGraphInstantiateWithFlags)],
        b"cuGraphDestroy" => vec![v!(10000, cuGraphDestroy)],
        b"cuGraphExecDestroy" => vec![v!(10000, cuGraphExecDestroy)],
        b"cuCtxSynchronize" => vec![v!(2000, cuCtxSynchronize)],
        b"cuEventCreate" => vec![v!(2000, cuEventCreate)],
        b"cuEventDestroy" => vec![v!(4000, cuEventDestroy_v2)],
        b"cuEventRecord" => vec![v!(2000, cuEventRecord)],
        b"cuEventQuery" => vec![v!(2000, cuEventQuery)],
        b"cuEventSynchronize" => vec![v!(2000, cuEventSynchronize)],
        b"cuEventElapsedTime" => vec![v!(2000, cuEventElapsedTime)],
        _ => Vec::new(),
    }
}

/// The `_ptsz` variant of a base name, for `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
fn per_thread(name: &[u8]) -> Option<*mut c_void> {
    match name {
        b"cuMemAllocAsync" => Some(cuMemAllocAsync_ptsz as *mut c_void),
        b"cuMemFreeAsync" => Some(cuMemFreeAsync_ptsz as *mut c_void),
        b"cuMemAllocFromPoolAsync" => Some(cuMemAllocFromPoolAsync_ptsz as *mut c_void),
        b"cuLaunchKernel" => Some(cuLaunchKernel_ptsz as *mut c_void),
        b"cuLaunchKernelEx" => Some(cuLaunchKernelEx_ptsz as *mut c_void),
        b"cuLaunchCooperativeKernel" => Some(cuLaunchCooperativeKernel_ptsz as *mut c_void),
        b"cuGraphLaunch" => Some(cuGraphLaunch_ptsz as *mut c_void),
        b"cuStreamSynchronize" => Some(cuStreamSynchronize_ptsz as *mut c_void),
        b"cuStreamIsCapturing" => Some(cuStreamIsCapturing_ptsz as *mut c_void),
        b"cuEventRecord" => Some(cuEventRecord_ptsz as *mut c_void),
        _ => None,
    }
}

/// The lookup shared by both entry points; returns the query status.
///
/// # Safety
///
/// `symbol` is NULL or NUL-terminated; `pfn` is NULL or valid for writes.
unsafe fn lookup(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> (CUresult, c_int) {
    if symbol.is_null() || pfn.is_null() {
        return (
            CUDA_ERROR_INVALID_VALUE,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        );
    }
    // SAFETY: non-NULL and NUL-terminated per the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let versions = versions(name);
    let chosen = versions.iter().rev().find(|v| v.since <= cuda_version);
    let (rc, status, address) = match chosen {
        Some(v) => {
            let per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0)
                .then(|| per_thread(name))
                .flatten();
            (
                CUDA_SUCCESS,
                CU_GET_PROC_ADDRESS_SUCCESS,
                per_thread.unwrap_or(v.address),
            )
        }
        None if versions.is_empty() => (
            CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            std::ptr::null_mut(),
        ),
        None => (
            CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            std::ptr::null_mut(),
        ),
    };
    // SAFETY: checked non-NULL above.
    unsafe { pfn.write(address) };
    (rc, status)
}

/// `cuGetProcAddress` (CUDA 11.3+): resolves a base name to the versioned
/// symbol for `cuda_version`.
///
/// # Safety
///
/// `symbol` is NULL or NUL-terminated; `pfn` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's arguments, as documented.
    guard(
        || match unsafe { lookup(symbol, pfn, cuda_version, flags) } {
            (CUDA_SUCCESS, _) => Ok(()),
            (rc, _) => Err(rc),
        },
    )
}

/// `cuGetProcAddress_v2` (CUDA 12+): as `cuGetProcAddress`, and reports why
/// a lookup failed in `symbol_status`.
///
/// # Safety
///
/// As `cuGetProcAddress`; `symbol_status` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller's arguments, as documented.
        let (rc, status) = unsafe { lookup(symbol, pfn, cuda_version, flags) };
        if !symbol_status.is_null() {
            // SAFETY: non-NULL, valid for writes per the caller.
            unsafe { symbol_status.write(status) };
        }
        if rc == CUDA_SUCCESS { Ok(()) } else { Err(rc) }
    })
}
