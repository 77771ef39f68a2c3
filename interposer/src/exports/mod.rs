//! The exports layer: the symbols the dynamic loader finds in
//! `libtessera_vgpu.so` before the real libraries' (every hooked CUDA and
//! NVML function, each a call into the policy layer under the panic guard),
//! our `dlsym`, and `cuGetProcAddress`'s substitution of our exports.

#[macro_use]
pub(crate) mod generate;
pub mod cuda;
// The trampoline is written for x86_64; on other targets `dlsym` is not
// intercepted. Unit tests do not export it (they would intercept their own).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[cfg_attr(test, allow(dead_code))]
pub(crate) mod dlsym;
pub(crate) mod guard;
pub mod nvml;
pub(crate) mod proc_address;
