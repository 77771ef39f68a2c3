//! Every launch hook (`cuLaunchKernel`, `cuLaunchCooperativeKernel`,
//! `cuLaunchKernelEx`, `cuGraphLaunch`, each with its `_ptsz` variant) runs
//! the one throttle body here: straight to the driver when no compute limit
//! applies (one load of [`MODE`]), else through the limiter, out of line
//! ([`throttled`], cold), so that the fast path spills nothing.

use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use tessera_vgpu_region::MAX_DEVICES;

use crate::log::DEBUG;
use crate::policy::compute::limiter::Limiter;
use crate::policy::process::{State, core_policy, state};
use crate::sys::{
    CUDA_ERROR_NOT_INITIALIZED, CUfunction, CUgraphExec, CUlaunchConfig, CUresult, CUstream,
};

/// Not configured yet: the first launch sets the process up.
const UNKNOWN: u8 = 0;
/// No compute limit in this process: launches go straight to the driver.
const OFF: u8 = 1;
/// A limiter exists (some device has a limit the policy applies).
const ON: u8 = 2;

/// What launches do, in one process-wide byte: the fast path's one load.
static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The process's limiter, when a device has a compute limit that the
/// policy does not disable (or the container's priority is high).
static LIMITER: OnceLock<Option<Limiter>> = OnceLock::new();

/// The limiter of a process in `state`, made on first use, when it records
/// what launches must do ([`MODE`]).
fn limiter(state: &State) -> Option<&'static Limiter> {
    LIMITER
        .get_or_init(|| {
            let limiter = match state {
                State::Enforcing(enforcer) => enforcer.region().and_then(|region| {
                    let percent: [u8; MAX_DEVICES] =
                        std::array::from_fn(|dev| region.sm_limit(dev).unwrap_or(0));
                    Limiter::new(percent, core_policy(), region.priority())
                }),
                State::Disabled | State::Refused => None,
            };
            if let Some(limiter) = &limiter {
                log!(
                    DEBUG,
                    "compute limits per device (percent, 0 = none): {:?}, policy {}",
                    limiter.percent(),
                    core_policy().as_str()
                );
            }
            let mode = match state {
                State::Enforcing(_) if limiter.is_some() => ON,
                // A refused process answers from the slow path.
                State::Refused => ON,
                State::Disabled | State::Enforcing(_) => OFF,
            };
            MODE.store(mode, Ordering::Relaxed);
            limiter
        })
        .as_ref()
}

/// Runs a launch (`call`) on `stream` of kernel or graph `handle`,
/// throttled when a compute limit applies.
#[inline(always)]
pub(crate) fn launch(
    stream: CUstream,
    handle: *mut c_void,
    per_thread: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    launch_to(|| Some((stream, handle)), per_thread, call)
}

/// The throttle body of every launch: `call` when no compute limit applies,
/// else [`throttled`]. `target` says where the launch goes (its stream and
/// its kernel or graph handle), or `None` for the driver to answer; it is
/// asked only on the slow path.
#[inline(always)]
pub(crate) fn launch_to(
    target: impl FnOnce() -> Option<(CUstream, *mut c_void)>,
    per_thread: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if MODE.load(Ordering::Relaxed) == OFF {
        return call();
    }
    throttled(target, per_thread, call)
}

/// The slow path: sets the process up on the first launch, then waits for
/// budget and measures the launch when a compute limit applies.
#[cold]
#[inline(never)]
fn throttled(
    target: impl FnOnce() -> Option<(CUstream, *mut c_void)>,
    per_thread: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some((stream, handle)) = target() else {
        // The driver's own answer (e.g. for a NULL `CUlaunchConfig`).
        return call();
    };
    let state = state();
    let limiter = limiter(state);
    match state {
        State::Refused => CUDA_ERROR_NOT_INITIALIZED,
        State::Disabled => call(),
        State::Enforcing(enforcer) => match (limiter, enforcer.region()) {
            (Some(limiter), Some(region)) => {
                let slot = enforcer.own_slot();
                limiter.launch(region, slot, stream, handle, per_thread, call)
            }
            _ => call(),
        },
    }
}

/// `cuLaunchKernel` and `_ptsz`, `cuLaunchCooperativeKernel` and `_ptsz`:
/// one hook body per driver function, each the throttle body around the
/// real call.
macro_rules! grid_launches {
    ($( $name:ident => $real:ident, $per_thread:expr, ($($extra:ident),*); )*) => {
        $(
            #[doc = concat!("`", stringify!($real), "`, throttled by the compute limit.")]
            ///
            /// # Safety
            ///
            /// The driver function's contract; the arguments are passed through.
            #[allow(clippy::too_many_arguments)]
            #[inline(always)]
            pub(crate) unsafe fn $name(
                f: CUfunction,
                grid_x: c_uint,
                grid_y: c_uint,
                grid_z: c_uint,
                block_x: c_uint,
                block_y: c_uint,
                block_z: c_uint,
                shared_mem_bytes: c_uint,
                stream: CUstream,
                params: *mut *mut c_void,
                $($extra: *mut *mut c_void,)*
            ) -> CUresult {
                launch(stream, f, $per_thread, move || {
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
                        $(, $extra)*
                    ))
                })
            }
        )*
    };
}

grid_launches! {
    launch_kernel => cuLaunchKernel, false, (extra);
    launch_kernel_ptsz => cuLaunchKernel_ptsz, true, (extra);
    launch_cooperative_kernel => cuLaunchCooperativeKernel, false, ();
    launch_cooperative_kernel_ptsz => cuLaunchCooperativeKernel_ptsz, true, ();
}

/// `cuLaunchKernelEx`: the stream is the one `config` names.
///
/// # Safety
///
/// `config` is NULL or points to a `CUlaunchConfig` (the driver's contract).
#[inline(always)]
pub(crate) unsafe fn launch_kernel_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: NULL or a valid CUlaunchConfig, per the caller.
    let target = move || unsafe { config.as_ref() }.map(|c| (c.stream, f));
    launch_to(target, false, move || {
        real!(cuLaunchKernelEx(config, f, params, extra))
    })
}

/// `cuLaunchKernelEx_ptsz`.
///
/// # Safety
///
/// `config` is NULL or points to a `CUlaunchConfig` (the driver's contract).
#[inline(always)]
pub(crate) unsafe fn launch_kernel_ex_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: NULL or a valid CUlaunchConfig, per the caller.
    let target = move || unsafe { config.as_ref() }.map(|c| (c.stream, f));
    launch_to(target, true, move || {
        real!(cuLaunchKernelEx_ptsz(config, f, params, extra))
    })
}

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
    launch(stream, exec, true, move || {
        real!(cuGraphLaunch_ptsz(exec, stream))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_pass_straight_through_once_the_mode_is_off() {
        // The fast path: with MODE off, the driver call is made and nothing else.
        MODE.store(OFF, Ordering::Relaxed);
        let mut called = 0;
        let rc = launch(std::ptr::null_mut(), std::ptr::null_mut(), false, || {
            called += 1;
            7
        });
        assert_eq!((rc, called), (7, 1));
    }
}
