//! Contexts and their device memory: `cuCtxCreate_v2`, `_v3` and `_v4`,
//! `cuCtxDestroy_v2`, the current context (`cuCtxSetCurrent`,
//! `cuCtxGetCurrent`, `cuCtxGetDevice`, `cuCtxGetId`), and primary contexts
//! (`cuDevicePrimaryCtxRetain`, `cuDevicePrimaryCtxRelease_v2`).
//!
//! Every context takes `FAKE_CUDA_CONTEXT_MEMORY` bytes of its device
//! (default 0) while it exists, as a real one takes its footprint. A
//! device's primary context is made by its first retain and destroyed by
//! the release that drops its retain count to zero.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::base::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUcontext,
    CUdevice, CUresult, guard, write,
};
use crate::devices::{device, initialized, physical};
use crate::inject;

/// Live contexts (their addresses) → device.
static CONTEXTS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

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

pub(crate) fn current_device() -> Result<usize, CUresult> {
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

/// `FAKE_CUDA_CONTEXT_MEMORY` in bytes.
fn context_memory() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("FAKE_CUDA_CONTEXT_MEMORY")
            .ok()
            .and_then(|v| fake_gpu::physical::parse_bytes(&v))
            .unwrap_or(0)
    })
}

/// A new context on `device`, taking its memory; not made current.
pub(crate) fn create(device: usize, primary: bool) -> Result<usize, CUresult> {
    let bytes = context_memory();
    if !physical()?.reserve(device, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let id = NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed);
    let ctx = Box::into_raw(Box::new(Context {
        device,
        id,
        bytes,
        primary,
    })) as usize;
    CONTEXTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(ctx);
    Ok(ctx)
}

/// Whether `ctx` is a context created here and not yet destroyed.
fn live(ctx: usize) -> bool {
    CONTEXTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|set| set.contains(&ctx))
}

/// `cuCtxCreate`: a new context on `dev`, made current and written to `pctx`.
pub(crate) fn create_current(pctx: *mut CUcontext, dev: CUdevice) -> Result<(), CUresult> {
    let device = device(dev)?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = create(device, false)?;
    CURRENT.set(ctx);
    // SAFETY: checked non-NULL above; valid for writes per the C contract.
    unsafe { pctx.write(ctx as CUcontext) };
    Ok(())
}

/// Destroys a live context and gives back its memory; a primary context
/// only when `primary` (its last release).
pub(crate) fn destroy(ctx: usize, primary: bool) -> Result<(), CUresult> {
    {
        let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        let set = contexts.get_or_insert_with(HashSet::new);
        // SAFETY: a member of the live set is a context from `create`.
        if !set.contains(&ctx) || unsafe { &*(ctx as *const Context) }.primary != primary {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        set.remove(&ctx);
    }
    if CURRENT.get() == ctx {
        CURRENT.set(0);
    }
    // SAFETY: `ctx` came from Box::into_raw in `create` and was removed from
    // the live set just now, so it is freed once.
    let context = unsafe { Box::from_raw(ctx as *mut Context) };
    physical()?.release(context.device, context.bytes);
    Ok(())
}

/// `cuCtxCreate_v3` (CUDA 11.4): affinity parameters are ignored.
///
/// # Safety
///
/// `pctx` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    _count: c_int,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // Not through cuCtxCreate_v2: an exported symbol would resolve to the
    // interposer's hook.
    guard(|| create_current(pctx, dev))
}

/// `cuCtxCreate_v4` (CUDA 12.5): creation parameters are ignored.
///
/// # Safety
///
/// `pctx` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| create_current(pctx, dev))
}

/// Primary contexts: device → (context, retain count).
static PRIMARY: Mutex<Option<HashMap<usize, (usize, u32)>>> = Mutex::new(None);

/// `cuDevicePrimaryCtxRetain`: the device's primary context, made by the
/// first retain; not made current.
///
/// # Safety
///
/// `pctx` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let device = device(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut primary = PRIMARY.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = match primary.get_or_insert_with(HashMap::new).get_mut(&device) {
            Some((ctx, count)) => {
                *count += 1;
                *ctx
            }
            None => {
                let ctx = create(device, true)?;
                primary
                    .get_or_insert_with(HashMap::new)
                    .insert(device, (ctx, 1));
                ctx
            }
        };
        // SAFETY: checked non-NULL above.
        unsafe { pctx.write(ctx as CUcontext) };
        Ok(())
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release destroys the primary
/// context and gives back its memory.
///
/// # Safety
///
/// Safe with any value: invalid devices and unretained contexts are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| {
        let device = device(dev)?;
        let mut primary = PRIMARY.lock().unwrap_or_else(|e| e.into_inner());
        let map = primary.get_or_insert_with(HashMap::new);
        let (ctx, count) = map.get_mut(&device).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        *count -= 1;
        if *count == 0 {
            let ctx = *ctx;
            map.remove(&device);
            destroy(ctx, true)?;
        }
        Ok(())
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
    inject::guard("cuCtxCreate_v2", || create_current(pctx, dev))
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
        destroy(ctx as usize, false)
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
        let known = ctx == 0 || live(ctx);
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
        let known = ctx != 0 && live(ctx);
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
