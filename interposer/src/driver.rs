//! The real driver: `libcuda.so.1` opened by soname with `dlopen` (never
//! linked), its functions resolved once into a table, and the `driver_api!`
//! macro that declares each hooked function once.

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

use crate::hooks::RealFns;
use crate::sys::{CUDA_ERROR_NOT_FOUND, CUresult};

/// Overrides where the real driver is loaded from (a path or a soname).
/// Tests point it at the fake driver; production leaves it unset.
pub const TESSERA_REAL_LIBCUDA: &str = "TESSERA_REAL_LIBCUDA";

/// Where the real driver is looked for when the override is unset: the
/// soname first (the dynamic loader's search path), then the usual
/// locations of distribution and container-toolkit installs.
const LIBCUDA_CANDIDATES: &[&CStr] = &[
    c"libcuda.so.1",
    c"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    c"/usr/lib64/libcuda.so.1",
    c"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
];

/// `dlsym` itself, as libc (or libdl) defines it.
pub(crate) type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Declares the hooked driver functions once.
///
/// `hooked` entries become exported `extern "C"` symbols that run the named
/// body under [`crate::guard`], plus a field of [`RealFns`] holding the real
/// function; `called` entries are only resolved (the hooks call them). The
/// macro also generates `hook_for(name)`, used by the `dlsym` and
/// `cuGetProcAddress` paths, and `RealFns::hook_for_real(address)`.
macro_rules! driver_api {
    (
        hooked {
            $( fn $hook:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) => $body:path; )*
        }
        called {
            $( fn $call:ident ( $( $cty:ty ),* $(,)? ); )*
        }
    ) => {
        /// The real driver's functions, resolved once; `None` when the
        /// driver does not export the name.
        #[allow(non_snake_case)]
        pub struct RealFns {
            $(
                #[doc = concat!("The real `", stringify!($hook), "`.")]
                pub $hook: Option<unsafe extern "C" fn($($ty),*) -> CUresult>,
            )*
            $(
                #[doc = concat!("The real `", stringify!($call), "`.")]
                pub $call: Option<unsafe extern "C" fn($($cty),*) -> CUresult>,
            )*
        }

        impl RealFns {
            /// Resolves every function with `lookup`, which returns NULL for
            /// a missing name.
            pub(crate) fn resolve(lookup: impl Fn(&std::ffi::CStr) -> *mut std::ffi::c_void) -> Self {
                Self {
                    $(
                        $hook: {
                            let ptr = lookup(
                                // SAFETY: a string literal with one NUL, at its end.
                                unsafe { std::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($hook), "\0").as_bytes()) },
                            );
                            // SAFETY: a non-NULL address the driver exports
                            // under this name is a function with this C
                            // signature (cuda.h).
                            (!ptr.is_null()).then(|| unsafe {
                                std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn($($ty),*) -> CUresult>(ptr)
                            })
                        },
                    )*
                    $(
                        $call: {
                            let ptr = lookup(
                                // SAFETY: a string literal with one NUL, at its end.
                                unsafe { std::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($call), "\0").as_bytes()) },
                            );
                            // SAFETY: as above, the exported function of this name has this signature.
                            (!ptr.is_null()).then(|| unsafe {
                                std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn($($cty),*) -> CUresult>(ptr)
                            })
                        },
                    )*
                }
            }

            /// Our export for the hooked function whose real address is
            /// `real`, if any: the exact versioned symbol, whatever name it
            /// was looked up by.
            pub(crate) fn hook_for_real(&self, real: *mut std::ffi::c_void) -> Option<*mut std::ffi::c_void> {
                $(
                    if self.$hook.is_some_and(|f| f as *mut std::ffi::c_void == real) {
                        return Some(exports::$hook as *mut std::ffi::c_void);
                    }
                )*
                None
            }

            /// Any resolved function, to find where the driver is mapped.
            pub(crate) fn any(&self) -> Option<*mut std::ffi::c_void> {
                None$(.or(self.$hook.map(|f| f as *mut std::ffi::c_void)))*
            }
        }

        /// Our export for a hooked name, matched exactly (never by prefix).
        pub(crate) fn hook_for(name: &[u8]) -> Option<*mut std::ffi::c_void> {
            $(
                if name == stringify!($hook).as_bytes() {
                    return Some(exports::$hook as *mut std::ffi::c_void);
                }
            )*
            None
        }

        /// The hooked names, in declaration order.
        pub const HOOKED: &[&str] = &[$(stringify!($hook)),*];

        /// The exported symbols (`#[no_mangle]` outside unit tests).
        pub mod exports {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[doc = concat!("Tessera's `", stringify!($hook), "`, see [`", stringify!($body), "`].")]
                ///
                /// # Safety
                ///
                /// The C contract of the CUDA driver function of this name.
                #[allow(non_snake_case)]
                #[cfg_attr(not(test), unsafe(no_mangle))]
                pub unsafe extern "C" fn $hook( $($arg: $ty),* ) -> CUresult {
                    // SAFETY: the caller upholds the C contract of this
                    // driver function, which is the contract of the body.
                    crate::guard(|| unsafe { $body($($arg),*) })
                }
            )*
        }
    };
}

/// Calls the real driver function `name` with `args`, or answers
/// `CUDA_ERROR_NOT_FOUND` when the driver lacks it.
macro_rules! real {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        match $crate::driver::driver().fns.$name {
            // SAFETY: the driver's own function, called with arguments that
            // satisfy its C contract (the caller's, passed through, or ours).
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::driver::missing(stringify!($name)),
        }
    };
}

/// The loaded real driver.
#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))] // `handle` and `base` serve the dlsym export
pub(crate) struct Driver {
    /// The `dlopen` handle (0 when no driver could be loaded).
    pub(crate) handle: usize,
    /// Where the driver is mapped (`dli_fbase`), 0 when unknown.
    base: usize,
    /// Its functions.
    pub(crate) fns: RealFns,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();
static REAL_DLSYM: OnceLock<Option<DlsymFn>> = OnceLock::new();

thread_local! {
    /// True while this thread loads the driver, so that the driver's own
    /// `dlsym` calls during its initialisation do not wait for themselves.
    static LOADING: Cell<bool> = const { Cell::new(false) };
}

/// The real driver, loaded on first use.
pub(crate) fn driver() -> &'static Driver {
    DRIVER.get_or_init(load)
}

/// The real driver if it is loaded or can be loaded without re-entering its
/// own initialisation on this thread.
#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))]
pub(crate) fn driver_unless_loading() -> Option<&'static Driver> {
    match DRIVER.get() {
        Some(driver) => Some(driver),
        None if LOADING.get() => None,
        None => Some(driver()),
    }
}

/// The answer for a driver function the real driver does not have.
pub(crate) fn missing(name: &str) -> CUresult {
    log!(crate::log::ERROR, "the CUDA driver has no {name}");
    CUDA_ERROR_NOT_FOUND
}

/// The real `dlsym`, found with `dlvsym(RTLD_NEXT)` so that our own export
/// (see `dlsym.rs`) is skipped.
pub(crate) fn real_dlsym() -> Option<DlsymFn> {
    *REAL_DLSYM.get_or_init(|| {
        [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"]
            .into_iter()
            .find_map(|version| {
                // SAFETY: dlvsym with NUL-terminated strings; RTLD_NEXT searches
                // the objects loaded after this library (libc / libdl).
                let ptr =
                    unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
                // SAFETY: libc's `dlsym` has exactly this signature.
                (!ptr.is_null())
                    .then(|| unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(ptr) })
            })
    })
}

fn load() -> Driver {
    LOADING.set(true);
    let driver = open_driver();
    LOADING.set(false);
    driver
}

fn open_driver() -> Driver {
    let unloaded = || Driver {
        handle: 0,
        base: 0,
        fns: RealFns::resolve(|_| std::ptr::null_mut()),
    };
    let Some(dlsym) = real_dlsym() else {
        log!(
            crate::log::ERROR,
            "cannot find libc's dlsym; the CUDA driver is unreachable"
        );
        return unloaded();
    };
    let override_path = std::env::var_os(TESSERA_REAL_LIBCUDA)
        .and_then(|p| std::ffi::CString::new(p.as_bytes()).ok());
    let candidates: Vec<&CStr> = match &override_path {
        Some(path) => vec![path.as_c_str()],
        None => LIBCUDA_CANDIDATES.to_vec(),
    };
    for candidate in candidates {
        // SAFETY: dlopen of a NUL-terminated path; the handle is never closed.
        let handle = unsafe { libc::dlopen(candidate.as_ptr(), libc::RTLD_NOW) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: `dlsym` is libc's, called on a live handle with NUL-terminated names.
        let fns = RealFns::resolve(|name| unsafe { dlsym(handle, name.as_ptr()) });
        let base = fns.any().map_or(0, |f| object_base(f.cast_const()));
        log!(
            crate::log::INFO,
            "real CUDA driver: {}",
            candidate.to_string_lossy()
        );
        return Driver {
            handle: handle as usize,
            base,
            fns,
        };
    }
    log!(
        crate::log::ERROR,
        "cannot dlopen the CUDA driver (libcuda.so.1{}); CUDA calls will fail",
        if override_path.is_some() {
            ", from TESSERA_REAL_LIBCUDA"
        } else {
            ""
        }
    );
    unloaded()
}

/// The load address of the object containing `addr`, 0 when unknown.
pub(crate) fn object_base(addr: *const c_void) -> usize {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info`.
    if unsafe { libc::dladdr(addr, info.as_mut_ptr()) } == 0 {
        return 0;
    }
    // SAFETY: dladdr returned non-zero, so it filled `info`.
    unsafe { info.assume_init() }.dli_fbase as usize
}

#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))]
impl Driver {
    /// Whether `addr` lies in the real driver's object.
    pub(crate) fn contains(&self, addr: *const c_void) -> bool {
        self.base != 0 && object_base(addr) == self.base
    }
}
