//! Kernel launches (plain, `Ex`, cooperative, and their `_ptsz` variants):
//! each occupies its device for `blocks × FAKE_CUDA_NS_PER_BLOCK` ns; and
//! `tesseraFakeBusy`, how busy the timeline kept a device.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use fake_gpu::clock::now_ns;

use crate::base::{CUDA_ERROR_INVALID_VALUE, CUresult, PER_THREAD_CALLS, guard, write};
use crate::devices::{initialized, physical_device};
use crate::exec::model::{CUDA_ERROR_INVALID_HANDLE, CUstream};
use crate::exec::streams::enqueue;

fn ns_per_block() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::env::var("FAKE_CUDA_NS_PER_BLOCK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000)
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

/// A launch with the grid in arguments: `$extra` names the trailing
/// `extra` argument where the function has one; `injected`, whether it has
/// an injection point (`inject.rs`).
macro_rules! launch_grid {
    (
        $name:ident,
        $per_thread:expr,
        injected: $injected:literal,
        $doc:literal,
        $safety:literal
        $(, $extra:ident)?
    ) => {
        #[doc = concat!("`", stringify!($name), "`: ", $doc)]
        ///
        /// # Safety
        ///
        #[doc = $safety]
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
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            if let Some(rc) = $injected
                .then(|| crate::inject::point(stringify!($name)))
                .flatten()
            {
                return rc;
            }
            kernel(f, [gx, gy, gz], [bx, by, bz], stream, $per_thread)
        }
    };
}

launch_grid!(
    cuLaunchKernel,
    false,
    injected: true,
    "occupies the device for the grid's blocks.",
    "Safe with any values: the fake neither reads `params` nor `extra`.",
    _extra
);
launch_grid!(
    cuLaunchKernel_ptsz,
    true,
    injected: true,
    "occupies the device for the grid's blocks.",
    "Safe with any values: the fake neither reads `params` nor `extra`.",
    _extra
);
launch_grid!(
    cuLaunchCooperativeKernel,
    false,
    injected: false,
    "as `cuLaunchKernel`.",
    "Safe with any values: the fake does not read `params`."
);
launch_grid!(
    cuLaunchCooperativeKernel_ptsz,
    true,
    injected: false,
    "as `cuLaunchKernel`.",
    "Safe with any values: the fake does not read `params`."
);

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
        let (physical, dev) = physical_device(dev)?;
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
