//! `dlsym` interception: programs and the CUDA runtime that `dlopen` the
//! driver and `dlsym` its functions get our hooks too.
//!
//! The export is a naked trampoline (x86_64) that asks [`route`] whether the
//! lookup is for a hooked name on the real driver's handle. If it is, the hook
//! is returned; otherwise the trampoline *jumps* (not calls) to libc's
//! `dlsym`, so the return address libc sees is the original caller's and
//! caller-relative lookups (`RTLD_NEXT`, dlmopen namespaces) behave exactly as
//! without us. Lookups are substituted only when:
//!
//! - the name is one we hook, compared exactly (never by prefix);
//! - the handle is the real driver's (or NVML's) own `dlopen` handle (`RTLD_DEFAULT`
//!   already finds our export first, and `RTLD_NEXT` must keep its meaning);
//! - the caller is not that library itself (a driver that looks itself up must
//!   get its own functions, or it would recurse into us);
//! - `CUDA_DISABLE_CONTROL` is not set.
//!
//! Recursion is impossible by construction: the hooks reach the driver
//! through the table resolved with libc's `dlsym`, never through this export.

use std::ffi::{CStr, c_char, c_void};

use crate::driver::cuda::driver_unless_loading;
use crate::driver::library::{DlsymFn, real_dlsym};
use crate::driver::nvml::nvml_unless_loading;
use crate::policy::process::{State, state};

/// What the trampoline does: return `found` if non-NULL, else jump to `real`.
#[repr(C)]
struct Route {
    found: *mut c_void,
    real: DlsymFn,
}

/// Answers NULL when libc's `dlsym` cannot be found (never in practice).
unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Decides one `dlsym` lookup; called only by the trampoline.
extern "C" fn route(handle: *mut c_void, symbol: *const c_char, caller: *const c_void) -> Route {
    let real = real_dlsym().unwrap_or(no_dlsym);
    let found = std::panic::catch_unwind(|| hook(handle, symbol, caller))
        .ok()
        .flatten()
        .unwrap_or(std::ptr::null_mut());
    Route { found, real }
}

fn hook(handle: *mut c_void, symbol: *const c_char, caller: *const c_void) -> Option<*mut c_void> {
    if symbol.is_null() || handle.is_null() || handle == libc::RTLD_NEXT {
        return None;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) };
    let name = name.to_bytes();
    let ours = |library_handle: usize, library_contains: &dyn Fn(*const c_void) -> bool| {
        library_handle == handle as usize && !library_contains(caller)
    };
    let hook = if let Some(hook) = crate::exports::cuda::hook_for(name) {
        let driver = driver_unless_loading()?;
        ours(driver.handle, &|a| driver.contains(a)).then_some(hook)?
    } else {
        let hook = crate::exports::nvml::hook_for(name)?;
        let nvml = nvml_unless_loading()?;
        ours(nvml.handle, &|a| nvml.contains(a)).then_some(hook)?
    };
    match state() {
        State::Disabled => None,
        State::Refused | State::Enforcing(_) => Some(hook),
    }
}

/// The exported `dlsym`; see the module docs.
///
/// # Safety
///
/// As for libc's `dlsym`.
#[cfg(all(target_arch = "x86_64", target_os = "linux", not(test)))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // On entry [rsp] is the caller's return address and rsp ≡ 8 (mod 16).
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "mov rdx, [rsp + 16]", // third argument of `route`: the caller
        "sub rsp, 8",          // realign to 16 for the call
        "call {route}",        // rax = found, rdx = libc's dlsym
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp rdx", // tail call: libc sees the original return address
        route = sym route,
    )
}
