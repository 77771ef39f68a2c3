//! What an allocation is known by ([`Key`]), and the cheap hash that shards
//! and looks keys up.

use std::hash::{Hash, Hasher};

use crate::sys::CUdeviceptr;

/// How many shards the allocations of a process are split into.
pub(crate) const SHARDS: usize = 16;

/// What an allocation is known by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    /// A device pointer (`cuMemAlloc*`), released by `cuMemFree` (or
    /// `cuMemFreeAsync`).
    Pointer(CUdeviceptr),
    /// A physical allocation handle (`cuMemCreate`), released by `cuMemRelease`.
    Handle(u64),
    /// A CUDA array (`cuArrayCreate_v2`, `cuArray3DCreate_v2`), released by
    /// `cuArrayDestroy`.
    Array(u64),
    /// A mipmapped array, released by `cuMipmappedArrayDestroy`.
    Mipmap(u64),
    /// A context made by `cuCtxCreate`, released by `cuCtxDestroy`.
    Context(u64),
    /// A device's primary context, released when its last retain is.
    Primary(u64),
    /// The graph allocations of an executable graph on one device, released
    /// by `cuGraphExecDestroy`.
    GraphExec(u64, u8),
}

impl Key {
    fn value(self) -> u64 {
        match self {
            Self::Pointer(v)
            | Self::Handle(v)
            | Self::Array(v)
            | Self::Mipmap(v)
            | Self::Context(v)
            | Self::Primary(v) => v,
            Self::GraphExec(v, dev) => v ^ u64::from(dev),
        }
    }

    /// The shard this key lives in.
    pub(crate) fn shard(self) -> usize {
        (self.value() >> 9) as usize % SHARDS
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Keys of different kinds with the same value only collide; `Eq` tells them apart.
        state.write_u64(self.value());
    }
}

/// A multiplicative hash for addresses and handles: the default SipHash
/// costs more than the rest of an allocation's bookkeeping together.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value ^ (value >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
