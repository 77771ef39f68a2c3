//! The last resort of a reservation that does not fit: reclaim what exited
//! processes left in the region, retry once, else refuse.

use tessera_vgpu_region::{OverLimit, Region, SlotId};

use crate::log::INFO;
use crate::sys::{CUDA_ERROR_OUT_OF_MEMORY, CUresult};

/// Reclaims dead processes' bytes and retries reserving `bytes` on `dev`
/// once; `CUDA_ERROR_OUT_OF_MEMORY` (logged with `over`) if it still does
/// not fit.
pub(crate) fn reserve_after_reclaim(
    region: &Region,
    slot: SlotId,
    dev: usize,
    bytes: u64,
    over: OverLimit,
) -> Result<(), CUresult> {
    let reclaimed = region.reclaim_dead();
    if reclaimed.slots > 0 {
        log!(
            INFO,
            "reclaimed {} bytes of {} exited processes",
            reclaimed.bytes,
            reclaimed.slots
        );
        if region.try_reserve(slot, dev, bytes).is_ok() {
            return Ok(());
        }
    }
    log!(
        INFO,
        "device {dev}: out of memory: {} bytes requested, {} of {} in use",
        over.requested,
        over.used,
        over.limit
    );
    Err(CUDA_ERROR_OUT_OF_MEMORY)
}
