//! A fake CUDA driver, built as `libcuda.so` with soname `libcuda.so.1`, for
//! testing the interposer on machines without a GPU.
//!
//! It implements the driver API the interposer and its tests call (devices,
//! contexts, device memory, VMM physical allocations, address ranges and
//! mappings (`vmm.rs`), memory pools and stream-ordered allocation
//! (`pool.rs`: immediate, a pool keeps freed memory up to its release
//! threshold), CUDA arrays (`array.rs`), `cuGetProcAddress(_v2)` with versioned names and
//! per-thread-stream flags, and execution on a simulated GPU timeline
//! (`exec/`: streams, events, kernel and graph launches, stream capture))
//! with the real driver's argument checks and error codes. Device memory is
//! bookkeeping only: pointers are unique addresses, never dereferenceable.
//!
//! "Physical" device state is shared between processes through a small file,
//! so several processes see one device, as they would see one GPU:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `FAKE_CUDA_STATE` | file holding the devices' physical usage | unset: private to the process (and its forks) |
//! | `FAKE_CUDA_DEVICE_COUNT` | number of devices, 1 to 16 | 1 |
//! | `FAKE_CUDA_DEVICE_MEMORY` | bytes per device (`k`, `m`, `g` suffixes) | `80g` |
//! | `FAKE_CUDA_DRIVER_VERSION` | what `cuDriverGetVersion` reports | 12090 |
//! | `FAKE_CUDA_NS_PER_BLOCK` | how long each block of a launched grid occupies the device, ns | 1000 |
//! | `FAKE_CUDA_CONTEXT_MEMORY` | device memory each context takes (`k`, `m`, `g` suffixes) | 0 |
//! | `FAKE_CUDA_POOL_CHUNK` | memory pools grow in multiples of this many bytes | 2 MiB (the granularity) |
//! | `FAKE_CUDA_FAIL`, `FAKE_CUDA_LATENCY_US` | fault and latency injection (`inject.rs`) | none |
//!
//! The device count and memory are fixed by the first process that creates
//! the state file. Memory of a process that dies without freeing stays used
//! (unlike a real driver, which frees it at process exit).
//!
//! `tesseraFakeStats(dev, *used, *peak)` reports a device's physical usage
//! and high-water mark, for tests that check the interposer never let a
//! container overcommit.
//!
//! Files, each depending only on those above it in this list: `base.rs`
//! (types, error codes, the panic guard), `inject.rs` (faults and latency),
//! `devices.rs`, `context.rs`, `memory.rs` (plain device memory), `vmm.rs`,
//! `array.rs`, `pool.rs`, `exec/` (the timeline: `model.rs`, `streams.rs`,
//! `launch.rs`, `events.rs`, `graph.rs`), `free.rs`, `ordered.rs`
//! (stream-ordered allocation) and `proc_address.rs`. The devices' shared
//! state is the `tessera-fake-gpu` crate's.

#![allow(unsafe_code)] // a C ABI library; every block carries a SAFETY comment
#![allow(non_snake_case)] // exports carry the driver's names
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

mod array;
mod base;
mod context;
mod devices;
mod exec;
mod free;
mod inject;
mod memory;
mod ordered;
mod pool;
mod proc_address;
mod vmm;
