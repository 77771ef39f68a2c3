//! Execution on the simulated timeline: streams, events, kernel launches
//! (plain, `Ex`, cooperative, and their `_ptsz` variants), stream capture
//! into graphs and graph launches.
//!
//! A launch occupies its device for `blocks × FAKE_CUDA_NS_PER_BLOCK` ns
//! (default 1000 ns per block; `blocks = gridDimX × gridDimY × gridDimZ`),
//! after everything enqueued before it on the device by any process (see
//! `fake-gpu/src/physical.rs`). Streams record when their last work ends, so stream and
//! context synchronisation sleep until then and events complete then. A
//! captured stream records launches into a graph instead of running them; a
//! graph launch occupies the device for the sum of its launches.
//! Synchronisation is also when memory pools give back memory (`pool.rs`).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::{
    CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, CUresult, PER_THREAD_CALLS, current_device, guard,
    initialized, physical, write,
};
use fake_gpu::clock::now_ns;

const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
const CUDA_ERROR_NOT_READY: CUresult = 600;
const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, the special stream handles.
const CU_STREAM_LEGACY: usize = 1;
const CU_STREAM_PER_THREAD: usize = 2;

type CUstream = *mut c_void;
type CUevent = *mut c_void;

/// A stream's state in this process.
#[derive(Default)]
struct Stream {
    /// When the last work enqueued on it ends (`CLOCK_MONOTONIC` ns).
    last_end: u64,
    /// While captured: the graph recorded so far.
    capture: Option<Graph>,
}

/// Where a stream handle leads: created streams by address; the legacy and
/// per-thread default streams by (kind, thread) and device.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum StreamKey {
    Created(usize),
    Legacy(usize),
    PerThread(usize, usize),
}

#[derive(Default)]
struct Exec {
    /// Created streams: address → device.
    created: HashMap<usize, usize>,
    streams: HashMap<StreamKey, Stream>,
    /// Events: handle → completion time once recorded.
    events: HashMap<usize, Option<u64>>,
    /// Graphs and instantiated executables by handle.
    graphs: HashMap<usize, Graph>,
    execs: HashMap<usize, Executable>,
    /// Graph memory per device.
    graph_memory: HashMap<usize, GraphMemory>,
    /// Addresses of graph allocations (they may be freed outside a graph).
    graph_pointers: std::collections::HashSet<u64>,
}

mod graph;

pub(crate) use graph::*;

static EXEC: Mutex<Option<Exec>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x5000_0000);
/// When the last work this process enqueued ends (for `cuCtxSynchronize`).
static LAST_END: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

fn with_exec<T>(body: impl FnOnce(&mut Exec) -> Result<T, CUresult>) -> Result<T, CUresult> {
    let mut guard = EXEC.lock().unwrap_or_else(|e| e.into_inner());
    body(guard.get_or_insert_with(Exec::default))
}

fn new_handle() -> usize {
    NEXT_HANDLE.fetch_add(16, Ordering::Relaxed) as usize
}

fn ns_per_block() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::env::var("FAKE_CUDA_NS_PER_BLOCK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000)
    })
}

/// The stream a handle names, and its device.
fn resolve(
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
fn sleep_until(deadline: u64) {
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
fn enqueue(stream: CUstream, per_thread: bool, duration: u64) -> Result<(), CUresult> {
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

fn kernel(
    f: *mut c_void,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    per_thread: bool,
) -> CUresult {
    if per_thread {
        PER_THREAD_CALLS.fetch_add(1, Ordering::Relaxed);
    }
    guard(|| {
        initialized()?;
        if f.is_null() {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if grid.contains(&0) || block.contains(&0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let blocks = grid.iter().map(|&g| u64::from(g)).product::<u64>();
        enqueue(stream, per_thread, blocks * ns_per_block())
    })
}

macro_rules! launch_kernel {
    ($name:ident, $per_thread:expr) => {
        #[doc = concat!("`", stringify!($name), "`: occupies the device for the grid's blocks.")]
        ///
        /// # Safety
        ///
        /// Safe with any values: the fake neither reads `params` nor `extra`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            _shared: c_uint,
            stream: CUstream,
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CUresult {
            if let Some(rc) = crate::inject::point(stringify!($name)) {
                return rc;
            }
            kernel(f, [gx, gy, gz], [bx, by, bz], stream, $per_thread)
        }
    };
}

launch_kernel!(cuLaunchKernel, false);
launch_kernel!(cuLaunchKernel_ptsz, true);

macro_rules! launch_cooperative {
    ($name:ident, $per_thread:expr) => {
        #[doc = concat!("`", stringify!($name), "`: as `cuLaunchKernel`.")]
        ///
        /// # Safety
        ///
        /// Safe with any values: the fake does not read `params`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            _shared: c_uint,
            stream: CUstream,
            _params: *mut *mut c_void,
        ) -> CUresult {
            kernel(f, [gx, gy, gz], [bx, by, bz], stream, $per_thread)
        }
    };
}

launch_cooperative!(cuLaunchCooperativeKernel, false);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz, true);

/// `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUstream,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

macro_rules! launch_ex {
    ($name:ident, $per_thread:expr) => {
        #[doc = concat!("`", stringify!($name), "`: the grid and stream come from `config`.")]
        ///
        /// # Safety
        ///
        /// `config` is NULL or points to a `CUlaunchConfig`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const LaunchConfig,
            f: *mut c_void,
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CUresult {
            // SAFETY: NULL or valid per the caller.
            match unsafe { config.as_ref() } {
                Some(c) => kernel(f, c.grid, c.block, c.stream, $per_thread),
                None => CUDA_ERROR_INVALID_VALUE,
            }
        }
    };
}

launch_ex!(cuLaunchKernelEx, false);
launch_ex!(cuLaunchKernelEx_ptsz, true);

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
    crate::inject::point("cuEventRecord").unwrap_or_else(|| event_record(event, stream, false))
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
    crate::inject::guard("cuEventQuery", || match event_time(event)? {
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

/// Not a CUDA function: how long device `dev` has been busy up to now and
/// how many launches it ran, in every process (the simulated timeline).
///
/// # Safety
///
/// `busy_ns`, `now` and `launches` are NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tesseraFakeBusy(
    dev: c_int,
    busy_ns: *mut u64,
    now: *mut u64,
    launches: *mut u64,
) -> CUresult {
    guard(|| {
        let physical = physical()?;
        let dev = usize::try_from(dev)
            .ok()
            .filter(|&d| d < physical.device_count())
            .ok_or(crate::CUDA_ERROR_INVALID_DEVICE)?;
        let t = now_ns();
        let (busy, count) = physical.busy(dev, t);
        // SAFETY: the caller's pointers, NULL-checked by `write`.
        unsafe {
            write(busy_ns, busy)?;
            write(now, t)?;
            write(launches, count)
        }
    })
}

const _: () = assert!(CUDA_SUCCESS == 0);
