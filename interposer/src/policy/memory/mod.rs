//! Memory charging rules: every way the driver takes device memory is
//! charged to the container's region before the driver is called, and
//! returned when the driver gives the memory back.
//!
//! | file | what is charged |
//! |---|---|
//! | `alloc.rs` | `cuMemAlloc_v2`, `cuMemAllocManaged`, `cuMemAllocPitch_v2`, in whole 2 MiB granules |
//! | `pool.rs` | stream-ordered allocations and memory pools |
//! | `graph.rs` | the allocations of executable graphs |
//! | `vmm.rs` | `cuMemCreate` physical allocations, while referenced or mapped |
//! | `array.rs` | CUDA arrays and mipmapped arrays |
//! | `context.rs` | contexts' measured footprints |
//! | `info.rs` | (nothing: `cuMemGetInfo_v2` and `cuDeviceTotalMem_v2` report the slice) |

pub(crate) mod alloc;
pub(crate) mod array;
pub(crate) mod context;
pub(crate) mod graph;
pub(crate) mod info;
pub(crate) mod pool;
pub(crate) mod vmm;
