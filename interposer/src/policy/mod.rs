//! The policy layer: the rules the interposer enforces, each taking what it
//! needs from the layers below (the driver, the accounting) and from the
//! process's state (`process.rs`), never from another policy's internals.
//!
//! - `process.rs`: what the hooks do in this process (pass through, refuse,
//!   or enforce), decided once by the first hooked call;
//! - `memory/`: memory charging rules, one file per way the driver takes
//!   device memory;
//! - `compute/`: the compute limiter behind every launch;
//! - `nvml/`: NVML's answers filtered to the container.

pub(crate) mod compute;
pub(crate) mod memory;
pub(crate) mod nvml;
pub(crate) mod process;
