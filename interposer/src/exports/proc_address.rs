//! `cuGetProcAddress` and `cuGetProcAddress_v2`: the CUDA runtime resolves
//! driver functions through them, bypassing symbol interposition.
//!
//! The real lookup runs first with the caller's version and flags, so the
//! driver picks the exact versioned symbol (`_v2`, `_v3`, `_ptsz`, ...) it
//! would have returned anyway; if that address is one of the functions we
//! hook, our export for that same symbol is returned instead. No version is
//! ever guessed.

use std::ffi::{c_char, c_int, c_void};

use crate::policy::process::{State, state};
use crate::sys::{CUDA_SUCCESS, CUdriverProcAddressQueryResult, CUresult, cuuint64_t};

/// Replaces `*pfn` by our hook for the same function (`ours`), when we hook
/// it.
///
/// # Safety
///
/// `pfn` is NULL or valid for reads and writes.
unsafe fn substitute(
    rc: CUresult,
    pfn: *mut *mut c_void,
    ours: impl Fn(*mut c_void) -> Option<*mut c_void>,
) -> CUresult {
    if rc != CUDA_SUCCESS || pfn.is_null() || matches!(state(), State::Disabled) {
        return rc;
    }
    // SAFETY: non-NULL, and the driver just wrote it (caller's contract).
    let found = unsafe { *pfn };
    if let Some(hook) = ours(found) {
        // SAFETY: as above.
        unsafe { *pfn = hook };
    }
    rc
}

/// `cuGetProcAddress` (CUDA 11.3+); `ours` finds our export for a real
/// function.
///
/// # Safety
///
/// As for `cuGetProcAddress`.
pub(crate) unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    ours: impl Fn(*mut c_void) -> Option<*mut c_void>,
) -> CUresult {
    let rc = real!(cuGetProcAddress(symbol, pfn, cuda_version, flags));
    // SAFETY: `pfn` is the caller's, valid per cuGetProcAddress's contract.
    unsafe { substitute(rc, pfn, ours) }
}

/// `cuGetProcAddress_v2` (CUDA 12+), with its `symbolStatus` untouched.
///
/// # Safety
///
/// As for `cuGetProcAddress_v2`.
pub(crate) unsafe fn get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut CUdriverProcAddressQueryResult,
    ours: impl Fn(*mut c_void) -> Option<*mut c_void>,
) -> CUresult {
    let rc = real!(cuGetProcAddress_v2(
        symbol,
        pfn,
        cuda_version,
        flags,
        symbol_status
    ));
    // SAFETY: `pfn` is the caller's, valid per cuGetProcAddress_v2's contract.
    unsafe { substitute(rc, pfn, ours) }
}
