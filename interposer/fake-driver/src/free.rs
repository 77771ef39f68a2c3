//! Freeing device memory whatever made it (`cuMemFree_v2`, and the free of
//! `cuMemFreeAsync`): a stream-ordered allocation goes back to its pool, a
//! graph allocation stays with its executable graph, a plain one goes back
//! to the device.

use crate::base::{CUdeviceptr, CUresult};
use crate::devices::initialized;
use crate::exec::graph::is_graph_pointer;
use crate::memory::free_plain;
use crate::{inject, pool};

/// Frees a device pointer: a pool's (stream-ordered) or a plain allocation.
pub(crate) fn free(dptr: CUdeviceptr) -> Result<(), CUresult> {
    initialized()?;
    if pool::free_pointer(dptr)? || is_graph_pointer(dptr) {
        return Ok(());
    }
    free_plain(dptr)
}

/// `cuMemFree_v2`.
///
/// # Safety
///
/// Safe with any value: unknown addresses are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    inject::guard("cuMemFree_v2", || free(dptr))
}
