//! The driver layer: the real `libcuda.so.1` and `libnvidia-ml.so.1`, loaded
//! on first use, the tables of their functions (generated from the
//! declaration lists `cuda_api!` and `nvml_api!`), the `real!` and
//! `real_nvml!` macros that call them, and the queries of the driver that
//! several policies share. It knows nothing of limits.

#[macro_use]
pub(crate) mod library;
#[macro_use]
pub(crate) mod table;
#[macro_use]
pub(crate) mod cuda;
#[macro_use]
pub(crate) mod nvml;
pub(crate) mod devices;
pub(crate) mod queries;
