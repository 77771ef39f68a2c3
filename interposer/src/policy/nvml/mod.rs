//! NVML filtering: inside a container, NVML answers for the container:
//! its memory slice (`memory.rs`) and its processes only (`procs.rs`).

pub(crate) mod memory;
pub(crate) mod procs;
