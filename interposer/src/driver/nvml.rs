//! NVML: every function the interposer hooks or calls, declared once
//! (`nvml_api!`), the table of the real ones and where it is loaded from.

use std::ffi::{c_char, c_uint};
use std::sync::OnceLock;

use crate::driver::library::{Library, Spec};
use crate::sys::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
    nvmlProcessUtilizationSample_t, nvmlReturn_t,
};

/// Overrides where the real NVML is loaded from.
pub(crate) const TESSERA_REAL_LIBNVIDIA_ML: &str = "TESSERA_REAL_LIBNVIDIA_ML";

/// Calls `$m!` with the NVML functions the interposer touches, as
/// `cuda_api!` does for the CUDA driver.
macro_rules! nvml_api {
    ($m:ident $($args:tt)*) => {
        $m! {
            $($args)*
            returns nvmlReturn_t;
            hooked {
                fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t);
                fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t);
                fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t);
                fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t);
                fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t);
                fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t);
                fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t);
                fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t);
                fn nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t);
                fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t);
                fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t);
                fn nvmlDeviceGetProcessUtilization(
                    device: nvmlDevice_t,
                    samples: *mut nvmlProcessUtilizationSample_t,
                    count: *mut c_uint,
                    last_seen: u64,
                );
            }
            called {
                fn nvmlDeviceGetIndex(nvmlDevice_t, *mut c_uint);
                fn nvmlInit_v2();
                fn nvmlDeviceGetHandleByIndex_v2(c_uint, *mut nvmlDevice_t);
                fn nvmlDeviceGetUUID(nvmlDevice_t, *mut c_char, c_uint);
                fn nvmlDeviceGetHandleByUUID(*const c_char, *mut nvmlDevice_t);
            }
        }
    };
}

nvml_api!(real_fns);

const LIBNVIDIA_ML: Spec = Spec {
    name: "libnvidia-ml.so.1",
    env: TESSERA_REAL_LIBNVIDIA_ML,
    candidates: &[
        c"libnvidia-ml.so.1",
        c"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        c"/usr/lib64/libnvidia-ml.so.1",
        c"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    ],
};

static NVML: OnceLock<Library<RealFns>> = OnceLock::new();

/// The real NVML, loaded on first use.
pub(crate) fn nvml() -> &'static Library<RealFns> {
    crate::driver::library::loaded(&NVML, &LIBNVIDIA_ML)
}

/// The real NVML if it is loaded or can be loaded without re-entering a
/// library's initialisation on this thread.
#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))]
pub(crate) fn nvml_unless_loading() -> Option<&'static Library<RealFns>> {
    crate::driver::library::loaded_unless_loading(&NVML, &LIBNVIDIA_ML)
}

/// Calls a real NVML function (`NVML_ERROR_FUNCTION_NOT_FOUND` if missing).
macro_rules! real_nvml {
    ($($call:tt)*) => {
        call_real!($crate::driver::nvml::nvml(), $crate::driver::library::missing_nvml, $($call)*)
    };
}
