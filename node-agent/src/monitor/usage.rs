//! What the containers' regions say: readings per container and device.

use std::collections::BTreeMap;

/// What a container's region says about one of its devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// Bytes the container's processes hold on the device.
    pub used: u64,
    /// When a live process of the container last launched a kernel on the
    /// device (`CLOCK_MONOTONIC` ns); `None` if none did, or launches are
    /// not recorded (the interposer records them for containers with a
    /// compute limit or high priority).
    pub launched_at: Option<u64>,
    /// GPU time the container's limited launches took on the device since
    /// its region was created, ns (the interposer measures it only while it
    /// enforces a compute limit there).
    pub busy_ns: u64,
}

/// Readings per container and CUDA ordinal, read from region files.
pub type Usage = BTreeMap<(String, usize), Reading>;
