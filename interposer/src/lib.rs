//! `libtessera_vgpu.so`: the `LD_PRELOAD` library that enforces a container's
//! GPU memory limits inside each of its processes.
//!
//! ```text
//!  application ──cuMemAlloc_v2──▶ exports (hooks.rs) ──reserve (CAS)──▶ shared region (mmap)
//!       │                              │                                 one per container
//!       │ dlopen + dlsym               └──real call──▶ libcuda.so.1 (dlopen'ed by soname,
//!       └──▶ dlsym (dlsym.rs) ── hooked name on libcuda's handle? ──▶ our export    never linked)
//!            cuGetProcAddress(_v2) ── real lookup, then our export for the same address
//! ```
//!
//! - [`hooks`] (CUDA driver) and [`nvml`] declare every hooked function once;
//!   the `driver_api!` macro generates the exported symbols and the table of
//!   real functions.
//! - Nothing happens at load time: no constructor, thread or file. The first
//!   hooked call reads the environment ([`config`]) and maps the region
//!   ([`enforce`]); a process that never calls CUDA never pays for either.
//! - Every export runs under `catch_unwind` and answers `CUDA_ERROR_UNKNOWN`
//!   if a hook panics.
//! - An invalid configuration (e.g. a malformed `CUDA_DEVICE_MEMORY_LIMIT`)
//!   is printed to stderr and every hooked call answers
//!   `CUDA_ERROR_NOT_INITIALIZED`: CUDA is refused, never left unlimited.
//!
//! See `docs/interposer.md` for the environment contract and the region layout.

#![allow(unsafe_code)] // an FFI library: every block carries a SAFETY comment
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

#[macro_use]
mod log;
#[macro_use]
mod driver;

mod compute;
pub mod config;
mod devices;
// The trampoline is written for x86_64; on other targets `dlsym` is not
// intercepted. Unit tests do not export it (they would intercept their own).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[cfg_attr(test, allow(dead_code))]
mod dlsym;
pub mod enforce;
pub mod hooks;
mod memory;
pub mod nvml;
mod proc_address;
pub mod sys;

use std::panic::{AssertUnwindSafe, catch_unwind};

use sys::{CUDA_ERROR_UNKNOWN, CUresult};

/// Runs a hook body, turning a panic into `CUDA_ERROR_UNKNOWN` (a panic must
/// never unwind into C).
///
/// Inlined into every export: `catch_unwind` costs nothing until a panic, so
/// a launch hook's fast path is one load and the driver call.
#[inline(always)]
fn guard(body: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        log!(log::ERROR, "a hook panicked; returning CUDA_ERROR_UNKNOWN");
        CUDA_ERROR_UNKNOWN
    })
}
