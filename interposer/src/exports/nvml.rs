//! The exported NVML functions: every `hooked` function of `nvml_api!`,
//! each a call of the policy function `nvml_route!` names for it.

use std::ffi::c_uint;

use crate::driver::nvml::RealFns;
use crate::policy::nvml;
use crate::sys::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
    nvmlProcessUtilizationSample_t, nvmlReturn_t,
};

/// The function behind each hooked NVML function.
macro_rules! nvml_route {
    (nvmlDeviceGetMemoryInfo) => {
        nvml::memory::memory_info
    };
    (nvmlDeviceGetMemoryInfo_v2) => {
        nvml::memory::memory_info_v2
    };
    (nvmlDeviceGetComputeRunningProcesses) => {
        nvml::procs::compute_processes
    };
    (nvmlDeviceGetComputeRunningProcesses_v2) => {
        nvml::procs::compute_processes_v2
    };
    (nvmlDeviceGetComputeRunningProcesses_v3) => {
        nvml::procs::compute_processes_v3
    };
    (nvmlDeviceGetGraphicsRunningProcesses) => {
        nvml::procs::graphics_processes
    };
    (nvmlDeviceGetGraphicsRunningProcesses_v2) => {
        nvml::procs::graphics_processes_v2
    };
    (nvmlDeviceGetGraphicsRunningProcesses_v3) => {
        nvml::procs::graphics_processes_v3
    };
    (nvmlDeviceGetMPSComputeRunningProcesses) => {
        nvml::procs::mps_processes
    };
    (nvmlDeviceGetMPSComputeRunningProcesses_v2) => {
        nvml::procs::mps_processes_v2
    };
    (nvmlDeviceGetMPSComputeRunningProcesses_v3) => {
        nvml::procs::mps_processes_v3
    };
    (nvmlDeviceGetProcessUtilization) => {
        nvml::procs::process_utilization
    };
}

nvml_api!(hook_exports route nvml_route;);
