//! Streams on the timeline: which stream a handle names (created, legacy
//! or per-thread default), enqueuing work on it (or recording it into its
//! capture), stream and context synchronisation, and stream capture.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use fake_gpu::clock::now_ns;

use crate::base::{CUDA_ERROR_INVALID_VALUE, CUresult, guard, write};
use crate::context::current_device;
use crate::devices::{initialized, physical};
use crate::exec::model::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUstream, Exec, Graph,
    StreamKey, new_handle, with_exec,
};

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, the special stream handles.
const CU_STREAM_LEGACY: usize = 1;
const CU_STREAM_PER_THREAD: usize = 2;

/// When the last work this process enqueued ends (for `cuCtxSynchronize`).
static LAST_END: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

/// The stream a handle names, and its device.
pub(crate) fn resolve(
    exec: &Exec,
    stream: CUstream,
    per_thread: bool,
) -> Result<(StreamKey, usize), CUresult> {
    let handle = stream as usize;
    if handle == CU_STREAM_PER_THREAD || (handle == 0 && per_thread) {
        let thread = THREAD_MARK.with(|m| m as *const u8 as usize);
        let dev = current_device()?;
        return Ok((StreamKey::PerThread(thread, dev), dev));
    }
    if handle == 0 || handle == CU_STREAM_LEGACY {
        let dev = current_device()?;
        return Ok((StreamKey::Legacy(dev), dev));
    }
    let dev = *exec.created.get(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok((StreamKey::Created(handle), dev))
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `deadline`.
pub(crate) fn sleep_until(deadline: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: an absolute sleep on a valid timespec; EINTR is retried.
    while unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    } == libc::EINTR
    {}
}

/// Enqueues `duration` ns on a stream (or records it into its capture).
pub(crate) fn enqueue(stream: CUstream, per_thread: bool, duration: u64) -> Result<(), CUresult> {
    initialized()?;
    let physical = physical()?;
    with_exec(|exec| {
        let (key, dev) = resolve(exec, stream, per_thread)?;
        let state = exec.streams.entry(key).or_default();
        if let Some(captured) = &mut state.capture {
            captured.record_kernel(duration);
            return Ok(());
        }
        let end = physical.enqueue(dev, now_ns(), duration);
        state.last_end = end;
        LAST_END.fetch_max(end, Ordering::Relaxed);
        Ok(())
    })
}

/// `cuStreamCreate` on the current context's device.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(out: *mut CUstream, _flags: c_uint) -> CUresult {
    guard(|| {
        let dev = current_device()?;
        let handle = new_handle();
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, handle as CUstream) }?;
        with_exec(|exec| {
            exec.created.insert(handle, dev);
            Ok(())
        })
    })
}

/// `cuStreamDestroy_v2`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    guard(|| {
        initialized()?;
        with_exec(|exec| {
            exec.created
                .remove(&(stream as usize))
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            exec.streams.remove(&StreamKey::Created(stream as usize));
            Ok(())
        })
    })
}

fn stream_synchronize(stream: CUstream, per_thread: bool) -> CUresult {
    guard(|| {
        initialized()?;
        let end = with_exec(|exec| {
            let (key, _) = resolve(exec, stream, per_thread)?;
            Ok(exec.streams.get(&key).map_or(0, |s| s.last_end))
        })?;
        sleep_until(end);
        crate::pool::synchronized()
    })
}

/// `cuStreamSynchronize`: sleeps until the stream's work has run.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    stream_synchronize(stream, false)
}

/// `cuStreamSynchronize_ptsz`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    stream_synchronize(stream, true)
}

/// `cuCtxSynchronize`: sleeps until all work of this process has run.
///
/// # Safety
///
/// Safe to call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        current_device()?;
        sleep_until(LAST_END.load(Ordering::Relaxed));
        crate::pool::synchronized()
    })
}

/// `cuStreamBeginCapture_v2`: launches on the stream are recorded, not run.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, _mode: c_int) -> CUresult {
    guard(|| {
        initialized()?;
        with_exec(|exec| {
            let (key, _) = resolve(exec, stream, false)?;
            if matches!(key, StreamKey::Legacy(_)) {
                // The legacy stream cannot be captured.
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            let state = exec.streams.entry(key).or_default();
            if state.capture.is_some() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            state.capture = Some(Graph::default());
            Ok(())
        })
    })
}

/// `cuStreamEndCapture`: the recorded launches become a graph.
///
/// # Safety
///
/// `graph` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut *mut c_void) -> CUresult {
    guard(|| {
        initialized()?;
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = with_exec(|exec| {
            let (key, _) = resolve(exec, stream, false)?;
            let captured = exec
                .streams
                .get_mut(&key)
                .and_then(|s| s.capture.take())
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let handle = new_handle();
            exec.graphs.insert(handle, captured);
            Ok(handle)
        })?;
        // SAFETY: checked non-NULL above.
        unsafe { write(graph, handle as *mut c_void) }
    })
}

fn is_capturing(stream: CUstream, per_thread: bool, status: *mut c_int) -> CUresult {
    guard(|| {
        initialized()?;
        let capturing = with_exec(|exec| {
            let (key, _) = resolve(exec, stream, per_thread)?;
            Ok(exec.streams.get(&key).is_some_and(|s| s.capture.is_some()))
        })?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(status, c_int::from(capturing)) }
    })
}

/// `cuStreamIsCapturing`: 1 (`CU_STREAM_CAPTURE_STATUS_ACTIVE`) or 0.
///
/// # Safety
///
/// `status` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult {
    is_capturing(stream, false, status)
}

/// `cuStreamIsCapturing_ptsz`.
///
/// # Safety
///
/// `status` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(
    stream: CUstream,
    status: *mut c_int,
) -> CUresult {
    is_capturing(stream, true, status)
}
