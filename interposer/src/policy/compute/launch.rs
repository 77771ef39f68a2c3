//! The launch hooks: each runs the driver's own function straight away
//! when no compute limit applies (one load of [`MODE`]), else through
//! [`limited`]. The slow path is a separate cold function, so the fast path
//! spills nothing.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use super::{MODE, OFF, launch, limited};
use crate::sys::{CUfunction, CUgraphExec, CUlaunchConfig, CUresult, CUstream};

macro_rules! kernel_launch {
    ($name:ident, $real:ident, $per_thread:expr) => {
        #[doc = concat!("`", stringify!($real), "`, throttled by the compute limit.")]
        ///
        /// # Safety
        ///
        /// The driver function's contract; the arguments are passed through.
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub(crate) unsafe fn $name(
            f: CUfunction,
            grid_x: std::ffi::c_uint,
            grid_y: std::ffi::c_uint,
            grid_z: std::ffi::c_uint,
            block_x: std::ffi::c_uint,
            block_y: std::ffi::c_uint,
            block_z: std::ffi::c_uint,
            shared_mem_bytes: std::ffi::c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            if MODE.load(Ordering::Relaxed) == OFF {
                return real!($real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_mem_bytes,
                    stream,
                    params,
                    extra
                ));
            }
            // Out of line, so that the fast path above spills nothing.
            #[cold]
            #[inline(never)]
            #[allow(clippy::too_many_arguments)]
            fn slow(
                f: CUfunction,
                grid_x: std::ffi::c_uint,
                grid_y: std::ffi::c_uint,
                grid_z: std::ffi::c_uint,
                block_x: std::ffi::c_uint,
                block_y: std::ffi::c_uint,
                block_z: std::ffi::c_uint,
                shared_mem_bytes: std::ffi::c_uint,
                stream: CUstream,
                params: *mut *mut c_void,
                extra: *mut *mut c_void,
            ) -> CUresult {
                limited(stream, f, $per_thread, move || {
                    real!($real(
                        f,
                        grid_x,
                        grid_y,
                        grid_z,
                        block_x,
                        block_y,
                        block_z,
                        shared_mem_bytes,
                        stream,
                        params,
                        extra
                    ))
                })
            }
            slow(
                f,
                grid_x,
                grid_y,
                grid_z,
                block_x,
                block_y,
                block_z,
                shared_mem_bytes,
                stream,
                params,
                extra,
            )
        }
    };
}

kernel_launch!(launch_kernel, cuLaunchKernel, false);
kernel_launch!(launch_kernel_ptsz, cuLaunchKernel_ptsz, true);

macro_rules! cooperative_launch {
    ($name:ident, $real:ident, $per_thread:expr) => {
        #[doc = concat!("`", stringify!($real), "`, throttled by the compute limit.")]
        ///
        /// # Safety
        ///
        /// The driver function's contract; the arguments are passed through.
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub(crate) unsafe fn $name(
            f: CUfunction,
            grid_x: std::ffi::c_uint,
            grid_y: std::ffi::c_uint,
            grid_z: std::ffi::c_uint,
            block_x: std::ffi::c_uint,
            block_y: std::ffi::c_uint,
            block_z: std::ffi::c_uint,
            shared_mem_bytes: std::ffi::c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
        ) -> CUresult {
            if MODE.load(Ordering::Relaxed) == OFF {
                return real!($real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_mem_bytes,
                    stream,
                    params
                ));
            }
            // Out of line, so that the fast path above spills nothing.
            #[cold]
            #[inline(never)]
            #[allow(clippy::too_many_arguments)]
            fn slow(
                f: CUfunction,
                grid_x: std::ffi::c_uint,
                grid_y: std::ffi::c_uint,
                grid_z: std::ffi::c_uint,
                block_x: std::ffi::c_uint,
                block_y: std::ffi::c_uint,
                block_z: std::ffi::c_uint,
                shared_mem_bytes: std::ffi::c_uint,
                stream: CUstream,
                params: *mut *mut c_void,
            ) -> CUresult {
                limited(stream, f, $per_thread, move || {
                    real!($real(
                        f,
                        grid_x,
                        grid_y,
                        grid_z,
                        block_x,
                        block_y,
                        block_z,
                        shared_mem_bytes,
                        stream,
                        params
                    ))
                })
            }
            slow(
                f,
                grid_x,
                grid_y,
                grid_z,
                block_x,
                block_y,
                block_z,
                shared_mem_bytes,
                stream,
                params,
            )
        }
    };
}

cooperative_launch!(launch_cooperative_kernel, cuLaunchCooperativeKernel, false);
cooperative_launch!(
    launch_cooperative_kernel_ptsz,
    cuLaunchCooperativeKernel_ptsz,
    true
);

macro_rules! ex_launch {
    ($name:ident, $real:ident, $per_thread:expr) => {
        #[doc = concat!("`", stringify!($real), "`: the stream is the one `config` names.")]
        ///
        /// # Safety
        ///
        /// `config` is NULL or points to a `CUlaunchConfig` (the driver's contract).
        #[inline(always)]
        pub(crate) unsafe fn $name(
            config: *const CUlaunchConfig,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            let call = move || real!($real(config, f, params, extra));
            if MODE.load(Ordering::Relaxed) == OFF {
                return call();
            }
            // SAFETY: NULL or a valid CUlaunchConfig, per the caller.
            let Some(stream) = (unsafe { config.as_ref() }).map(|c| c.stream) else {
                // The driver's own answer for a NULL configuration.
                return call();
            };
            limited(stream, f, $per_thread, call)
        }
    };
}

ex_launch!(launch_kernel_ex, cuLaunchKernelEx, false);
ex_launch!(launch_kernel_ex_ptsz, cuLaunchKernelEx_ptsz, true);

/// `cuGraphLaunch`, throttled; the graph is charged its measured duration.
///
/// # Safety
///
/// None beyond `cuGraphLaunch`'s.
#[inline(always)]
pub(crate) unsafe fn graph_launch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launch(stream, exec, false, move || {
        real!(cuGraphLaunch(exec, stream))
    })
}

/// `cuGraphLaunch_ptsz`.
///
/// # Safety
///
/// None beyond `cuGraphLaunch`'s.
#[inline(always)]
pub(crate) unsafe fn graph_launch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launch(stream, exec, true, || {
        real!(cuGraphLaunch_ptsz(exec, stream))
    })
}
