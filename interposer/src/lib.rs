//! `libtessera_vgpu.so`: the `LD_PRELOAD` library that enforces a container's
//! GPU memory limits inside each of its processes.
//!
//! ```text
//!  application ──cuMemAlloc_v2──▶ exports ──policy──▶ accounting: reserve (CAS) in the shared region (mmap)
//!       │                            │                            one per container
//!       │ dlopen + dlsym             └──real call──▶ driver: libcuda.so.1 (dlopen'ed by soname,
//!       └──▶ exports/dlsym.rs ── hooked name on libcuda's handle? ──▶ our export      never linked)
//!            cuGetProcAddress(_v2) ── real lookup, then our export for the same address
//! ```
//!
//! # Layers
//!
//! `sys → driver → accounting → policy → exports`, with `log` and `config`
//! beside `sys`. Each layer uses only those to its left; no module or file
//! depends on one that depends back on it (`hack/module-cycles.py` checks
//! it, and `tests/module_cycles.rs` runs it).
//!
//! - [`sys`]: the C types and constants of `cuda.h` and `nvml.h`; `log`:
//!   the stderr logger; [`config`]: the environment, parsed once.
//! - `driver`: the real libraries, loaded on first use; the tables of their
//!   functions, generated from one declaration list per library
//!   (`cuda_api!`, `nvml_api!`); `real!` to call them; the driver queries
//!   the policies share (current device, what a pool holds, which NVML
//!   device is which CUDA ordinal).
//! - `accounting`: pure bookkeeping in the container's shared region
//!   (reservations, tracked allocations, stores, this process's slot); it
//!   never calls the driver.
//! - `policy`: the rules. `process.rs` decides once what the hooks do in
//!   this process; `memory/` charges every way the driver takes device
//!   memory; `compute/` throttles every launch through one body; `nvml/`
//!   filters NVML's answers to the container.
//! - [`exports`]: the `#[no_mangle]` symbols, generated from the same
//!   declaration lists, each a call into the policy layer under the panic
//!   guard; our `dlsym`; `cuGetProcAddress`'s substitution.
//!
//! # Behaviour
//!
//! - Nothing happens at load time: no constructor, thread or file. The first
//!   hooked call reads the environment ([`config`]) and maps the region; a
//!   process that never calls CUDA never pays for either.
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
pub mod config;
pub mod sys;

#[macro_use]
mod driver;
mod accounting;
pub mod exports;
mod policy;
