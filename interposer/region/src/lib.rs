//! The shared accounting region of Tessera's interposer.
//!
//! Every process of a container maps the same file (the path comes from
//! `CUDA_DEVICE_MEMORY_SHARED_CACHE`). The interposer in each process reserves
//! device memory in it with a compare-and-swap *before* calling the driver, so
//! the processes of a container together never exceed the limit; the node
//! agent's monitor reads it to export per-container usage.
//!
//! ```text
//!  offset  size     what
//!  0       64       Header: magic "TSRVGPU1", version, sizes (written last: magic), task
//!                   priority, the node agent's hold (held ordinals, deadline)
//!  64      16 × 64  DeviceRecord per CUDA ordinal: limit, used (the reservation counter), peak,
//!                   compute limit, sharing, compute budget (tokens) and its refill time, busy time
//!  1088    1024×192 SlotRecord per process: state, pid, start time, host pid, used per device,
//!                   latest launch (time, ordinals)
//! ```
//!
//! The layout is documented field by field in `docs/interposer.md`. Slots are
//! claimed by CAS (`FREE → CLAIMING → LIVE`) and never move; a slot whose
//! process is gone (its pid is dead, a zombie, or now belongs to a process with
//! another start time) is reclaimed by CAS (`LIVE → RECLAIMING → FREE`) and its
//! usage is returned to the device counters.
//!
//! This crate has no CUDA in it: the node agent depends on it without the
//! interposer's cdylib. The processes of a container map the region
//! ([`Region`]); the node agent, for which the file is a tenant's and may be
//! anything, never maps it: [`RegionFile`] opens it without following links
//! or opening special files, checks its type, links and size, and reads and
//! writes it with `pread`/`pwrite` ([`Snapshot::parse`] validates the bytes).

#![allow(unsafe_code)] // mmap and the view of the mapping as atomics; each block says why it is sound
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

mod compute;
mod file;
pub mod priority;
mod process;
mod region;
mod slots;
mod snapshot;

pub use file::RegionFile;
pub use process::{process_alive, process_start_time};
pub use region::{
    Error, Limits, MAGIC, MAX_DEVICES, MINOR_VERSION, Opened, OverLimit, Priority, REGION_SIZE,
    Reclaimed, Region, Result, SLOTS, Sharing, SlotId, VERSION,
};
pub use snapshot::{DeviceUsage, ProcessUsage, Snapshot};
