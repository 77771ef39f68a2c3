//! Events on the timeline: `cuEventCreate`, `cuEventDestroy_v2`,
//! `cuEventRecord` (and `_ptsz`), `cuEventQuery`, `cuEventSynchronize` and
//! `cuEventElapsedTime`. An event completes when its stream's earlier work
//! has run.

use std::ffi::c_uint;

use fake_gpu::clock::now_ns;

use crate::base::{CUresult, guard, write};
use crate::context::current_device;
use crate::devices::initialized;
use crate::exec::model::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUevent, CUstream,
    new_handle, with_exec,
};
use crate::exec::streams::{resolve, sleep_until};
use crate::inject;

const CUDA_ERROR_NOT_READY: CUresult = 600;

/// `cuEventCreate` (flags ignored: every event is timed).
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(out: *mut CUevent, _flags: c_uint) -> CUresult {
    guard(|| {
        current_device()?;
        let handle = new_handle();
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, handle as CUevent) }?;
        with_exec(|exec| {
            exec.events.insert(handle, None);
            Ok(())
        })
    })
}

/// `cuEventDestroy_v2`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    guard(|| {
        initialized()?;
        with_exec(|exec| {
            exec.events
                .remove(&(event as usize))
                .map(|_| ())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)
        })
    })
}

fn event_record(event: CUevent, stream: CUstream, per_thread: bool) -> CUresult {
    guard(|| {
        initialized()?;
        with_exec(|exec| {
            let (key, _) = resolve(exec, stream, per_thread)?;
            let (capturing, last_end) = exec
                .streams
                .get(&key)
                .map_or((false, 0), |s| (s.capture.is_some(), s.last_end));
            if capturing {
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            let slot = exec
                .events
                .get_mut(&(event as usize))
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            *slot = Some(now_ns().max(last_end));
            Ok(())
        })
    })
}

/// `cuEventRecord`: completes when the stream's earlier work has run.
///
/// # Safety
///
/// Safe with any handles: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    inject::point("cuEventRecord").unwrap_or_else(|| event_record(event, stream, false))
}

/// `cuEventRecord_ptsz`.
///
/// # Safety
///
/// Safe with any handles: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) -> CUresult {
    event_record(event, stream, true)
}

fn event_time(event: CUevent) -> Result<Option<u64>, CUresult> {
    initialized()?;
    with_exec(|exec| {
        exec.events
            .get(&(event as usize))
            .copied()
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until the event completes.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(event: CUevent) -> CUresult {
    inject::guard("cuEventQuery", || match event_time(event)? {
        Some(time) if time > now_ns() => Err(CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    })
}

/// `cuEventSynchronize`: sleeps until the event completes.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    guard(|| {
        if let Some(time) = event_time(event)? {
            sleep_until(time);
        }
        crate::pool::synchronized()
    })
}

/// `cuEventElapsedTime`: milliseconds between two completed events.
///
/// # Safety
///
/// `ms` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    guard(|| {
        let (Some(start), Some(end)) = (event_time(start)?, event_time(end)?) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        if start.max(end) > now_ns() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        let elapsed = (end as f64 - start as f64) / 1e6;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(ms, elapsed as f32) }
    })
}
