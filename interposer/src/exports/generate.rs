//! `hook_exports!`: the exported symbols of a declaration list (`cuda_api!`,
//! `nvml_api!`), each a call of the policy function a route macro names for
//! it, under the panic guard.

/// Generates, from a declaration list and `route` (a macro mapping each
/// hooked name to the function that serves it):
///
/// - `exports`, the exported `extern "C"` symbols (`#[no_mangle]` outside
///   unit tests), each running its route under [`guard`];
/// - `hook_for(name)` and `RealFns::hook_for_real(address)`, used by the
///   `dlsym` and `cuGetProcAddress` paths;
/// - `HOOKED`, the hooked names in declaration order.
///
/// [`guard`]: crate::exports::guard::guard
macro_rules! hook_exports {
    (
        route $route:ident;
        returns $ret:ty;
        hooked {
            $( fn $hook:ident ( $( $arg:ident : $ty:ty ),* $(,)? ); )*
        }
        called {
            $( fn $call:ident ( $( $cty:ty ),* $(,)? ); )*
        }
    ) => {
        impl RealFns {
            /// Our export for the hooked function whose real address is
            /// `real`, if any: the exact versioned symbol, whatever name it
            /// was looked up by.
            #[allow(dead_code)] // NVML has no lookup function to substitute in
            pub(crate) fn hook_for_real(&self, real: *mut std::ffi::c_void) -> Option<*mut std::ffi::c_void> {
                $(
                    if self.$hook.is_some_and(|f| f as *mut std::ffi::c_void == real) {
                        return Some(exports::$hook as *mut std::ffi::c_void);
                    }
                )*
                None
            }
        }

        /// Our export for a hooked name, matched exactly (never by prefix).
        #[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))]
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
                #[doc = concat!("Tessera's `", stringify!($hook), "`: the policy function the route names for it, under the panic guard.")]
                ///
                /// # Safety
                ///
                /// The C contract of the driver function of this name.
                #[allow(non_snake_case)]
                #[cfg_attr(not(test), unsafe(no_mangle))]
                pub unsafe extern "C" fn $hook( $($arg: $ty),* ) -> $ret {
                    // SAFETY: the caller upholds the C contract of this
                    // driver function, which is the contract of the body.
                    $crate::exports::guard::guard(|| unsafe { $route!($hook)($($arg),*) })
                }
            )*
        }
    };
}
