//! Contexts and their device memory: `cuCtxCreate_v2` (in `lib.rs`),
//! `cuCtxCreate_v3`, `cuCtxCreate_v4`, `cuCtxDestroy_v2`, and primary
//! contexts (`cuDevicePrimaryCtxRetain`, `cuDevicePrimaryCtxRelease_v2`).
//!
//! Every context takes `FAKE_CUDA_CONTEXT_MEMORY` bytes of its device
//! (default 0) while it exists, as a real one takes its footprint. A
//! device's primary context is made by its first retain and destroyed by
//! the release that drops its retain count to zero.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

use crate::{
    CONTEXTS, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
    CURRENT, CUcontext, CUdevice, CUresult, Context, NEXT_CONTEXT_ID, device, guard, physical,
};

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
