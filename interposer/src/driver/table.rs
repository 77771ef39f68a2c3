//! `real_fns!`: the table of a real library's functions, generated from a
//! declaration list (`cuda_api!` in `cuda.rs`, `nvml_api!` in `nvml.rs`).

/// Generates `RealFns`, the table of the real functions a declaration list
/// names (hooked and called alike), and its [`Table`] implementation.
///
/// [`Table`]: crate::driver::library::Table
macro_rules! real_fns {
    (
        returns $ret:ty;
        hooked {
            $( fn $hook:ident ( $( $arg:ident : $ty:ty ),* $(,)? ); )*
        }
        called {
            $( fn $call:ident ( $( $cty:ty ),* $(,)? ); )*
        }
    ) => {
        /// The real library's functions, resolved once; `None` when the
        /// library does not export the name.
        #[allow(non_snake_case)]
        pub(crate) struct RealFns {
            $(
                #[doc = concat!("The real `", stringify!($hook), "`.")]
                pub(crate) $hook: Option<unsafe extern "C" fn($($ty),*) -> $ret>,
            )*
            $(
                #[doc = concat!("The real `", stringify!($call), "`.")]
                pub(crate) $call: Option<unsafe extern "C" fn($($cty),*) -> $ret>,
            )*
        }

        impl $crate::driver::library::Table for RealFns {
            fn resolve(lookup: impl Fn(&std::ffi::CStr) -> *mut std::ffi::c_void) -> Self {
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
                                std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(ptr)
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
                                std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn($($cty),*) -> $ret>(ptr)
                            })
                        },
                    )*
                }
            }

            fn any(&self) -> Option<*mut std::ffi::c_void> {
                None$(.or(self.$hook.map(|f| f as *mut std::ffi::c_void)))*
            }
        }
    };
}
