//! Execution on the simulated timeline: streams, events, kernel launches
//! (plain, `Ex`, cooperative, and their `_ptsz` variants), stream capture
//! into graphs and graph launches.
//!
//! A launch occupies its device for `blocks × FAKE_CUDA_NS_PER_BLOCK` ns
//! (default 1000 ns per block; `blocks = gridDimX × gridDimY × gridDimZ`),
//! after everything enqueued before it on the device by any process (see
//! `fake-gpu/src/physical.rs`). Streams record when their last work ends, so stream and
//! context synchronisation sleep until then and events complete then. A
//! captured stream records launches into a graph instead of running them; a
//! graph launch occupies the device for the sum of its launches.
//! Synchronisation is also when memory pools give back memory (`pool.rs`).
//!
//! `model.rs` holds the state (streams, events, graphs) the other files
//! share; `streams.rs` enqueues and synchronises, `launch.rs` launches
//! kernels, `events.rs` records and times events, `graph.rs` builds,
//! instantiates and launches graphs.

pub(crate) mod events;
pub(crate) mod graph;
pub(crate) mod launch;
pub(crate) mod model;
pub(crate) mod streams;
