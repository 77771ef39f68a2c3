//! The fake GPUs that `tessera-fake-cuda` (`libcuda.so.1`) and
//! `tessera-fake-nvml` (`libnvidia-ml.so.1`) both see, so that memory
//! allocated through the fake driver shows in the fake NVML, as on a real
//! GPU. The state lives in files every process maps (`FAKE_CUDA_STATE`, or
//! private memory when unset):
//!
//! - [`physical`]: each device's memory (total, used, high-water mark) and
//!   its timeline of work;
//! - [`procs`]: per process, the memory it holds and when its work ran;
//! - [`uuid`]: the devices' UUIDs, as CUDA and NVML report them;
//! - [`file`](mod@file) and [`clock`]: opening a state file, and the clock every
//!   process shares.

#![allow(unsafe_code)] // maps shared memory; every block carries a SAFETY comment
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

pub mod clock;
pub mod file;
pub mod physical;
pub mod procs;
pub mod uuid;
