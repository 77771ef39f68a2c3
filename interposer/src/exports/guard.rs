//! The panic guard every export runs its body under: a panic must never
//! unwind into C.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::log::ERROR;
use crate::sys::{CUDA_ERROR_UNKNOWN, CUresult};

/// Runs a hook body, turning a panic into `CUDA_ERROR_UNKNOWN` (a panic must
/// never unwind into C).
///
/// Inlined into every export: `catch_unwind` costs nothing until a panic, so
/// a launch hook's fast path is one load and the driver call.
#[inline(always)]
pub(crate) fn guard(body: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        log!(ERROR, "a hook panicked; returning CUDA_ERROR_UNKNOWN");
        CUDA_ERROR_UNKNOWN
    })
}
