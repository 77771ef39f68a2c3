//! What the real driver says, asked in one place for every policy: the
//! calling thread's device, and what a memory pool or a device's graph
//! memory holds.

use crate::sys::{
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CUDA_SUCCESS,
    CUdevice, CUmemoryPool, CUresult,
};

/// The device of the calling thread's current context.
pub(crate) fn current_device() -> Result<CUdevice, CUresult> {
    let mut dev: CUdevice = 0;
    match real!(cuCtxGetDevice(&mut dev)) {
        CUDA_SUCCESS => Ok(dev),
        rc => Err(rc),
    }
}

/// Bytes the driver says pool `pool` holds.
pub(crate) fn pool_reserved(pool: u64) -> Option<u64> {
    let mut bytes: u64 = 0;
    let rc = real!(cuMemPoolGetAttribute(
        pool as CUmemoryPool,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        (&raw mut bytes).cast(),
    ));
    (rc == CUDA_SUCCESS).then_some(bytes)
}

/// Bytes the driver reserves for graph allocations on `dev`.
pub(crate) fn graph_reserved(dev: usize) -> Option<u64> {
    let mut bytes: u64 = 0;
    let rc = real!(cuDeviceGetGraphMemAttribute(
        dev as CUdevice,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
        (&raw mut bytes).cast(),
    ));
    (rc == CUDA_SUCCESS).then_some(bytes)
}
