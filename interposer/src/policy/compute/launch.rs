//! Every launch hook (`cuLaunchKernel`, `cuLaunchCooperativeKernel`,
//! `cuLaunchKernelEx`, `cuGraphLaunch`, each with its `_ptsz` variant) runs
//! the one throttle body here, [`throttled`]: straight to the driver when no
//! compute limit applies (one load of [`MODE`]), else through the limiter,
//! out of line (cold), so that the fast path spills nothing.

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
/// throttled when a compute limit applies: `call` straight away when none
/// does (one load of [`MODE`]), else [`throttled`].
#[inline(always)]
pub(crate) fn launch(
    stream: CUstream,
    handle: *mut c_void,
    per_thread: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if MODE.load(Ordering::Relaxed) == OFF {
        return call();
    }
    throttled(move || Some((stream, handle)), per_thread, call)
}

/// The throttle body of every launch, out of line: sets the process up on
/// the first launch, then waits for budget and measures the launch when a
/// compute limit applies. `target` says where the launch goes (its stream
/// and its kernel or graph handle), or `None` for the driver to answer.
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

/// The kernel launch hooks, one macro for every signature: each calls the
/// real function straight away when no compute limit applies, else passes
/// its arguments to a cold function of its own that runs [`throttled`]
/// around the real call. Taking the arguments one by one (not a closure
/// built before the check) keeps the fast path a tail call that spills
/// nothing.
macro_rules! kernel_launches {
    ($(
        $(#[$doc:meta])*
        fn $name:ident => $real:ident ( $($arg:ident : $ty:ty),* $(,)? )
            to $target:expr, per_thread $per_thread:literal;
    )*) => {
        $(
            $(#[$doc])*
            ///
            /// # Safety
            ///
            /// The driver function's contract; the arguments are passed through.
            #[allow(clippy::too_many_arguments)]
            #[inline(always)]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> CUresult {
                if MODE.load(Ordering::Relaxed) == OFF {
                    return real!($real($($arg),*));
                }
                #[cold]
                #[inline(never)]
                #[allow(clippy::too_many_arguments)]
                fn slow($($arg: $ty),*) -> CUresult {
                    throttled(move || $target, $per_thread, move || real!($real($($arg),*)))
                }
                slow($($arg),*)
            }
        )*
    };
}

kernel_launches! {
    /// `cuLaunchKernel`, throttled by the compute limit.
    fn launch_kernel => cuLaunchKernel(
        f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
        block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream,
        params: *mut *mut c_void, extra: *mut *mut c_void,
    ) to Some((stream, f)), per_thread false;
    /// `cuLaunchKernel_ptsz`.
    fn launch_kernel_ptsz => cuLaunchKernel_ptsz(
        f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
        block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream,
        params: *mut *mut c_void, extra: *mut *mut c_void,
    ) to Some((stream, f)), per_thread true;
    /// `cuLaunchCooperativeKernel`, throttled by the compute limit.
    fn launch_cooperative_kernel => cuLaunchCooperativeKernel(
        f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
        block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream,
        params: *mut *mut c_void,
    ) to Some((stream, f)), per_thread false;
    /// `cuLaunchCooperativeKernel_ptsz`.
    fn launch_cooperative_kernel_ptsz => cuLaunchCooperativeKernel_ptsz(
        f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
        block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint, stream: CUstream,
        params: *mut *mut c_void,
    ) to Some((stream, f)), per_thread true;
    /// `cuLaunchKernelEx`: the stream is the one `config` names (`config`
    /// is NULL or points to a `CUlaunchConfig`, the driver's contract).
    fn launch_kernel_ex => cuLaunchKernelEx(
        config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
        extra: *mut *mut c_void,
    // SAFETY: NULL or a valid CUlaunchConfig, per the caller.
    ) to unsafe { config.as_ref() }.map(|c| (c.stream, f)), per_thread false;
    /// `cuLaunchKernelEx_ptsz`.
    fn launch_kernel_ex_ptsz => cuLaunchKernelEx_ptsz(
        config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
        extra: *mut *mut c_void,
    // SAFETY: NULL or a valid CUlaunchConfig, per the caller.
    ) to unsafe { config.as_ref() }.map(|c| (c.stream, f)), per_thread true;
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
