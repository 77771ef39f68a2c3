//! Raw CUDA driver and NVML types and constants: the only place they are
//! written down. Values are those of `cuda.h` (CUDA 12/13) and `nvml.h`; only
//! what the hooks use.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_void};

/// `CUresult`: 0 is success, everything else an error code.
pub type CUresult = c_int;
/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr`: a device address.
pub type CUdeviceptr = u64;
/// `CUcontext`: an opaque context handle.
pub type CUcontext = *mut c_void;
/// `CUstream`: an opaque stream handle (NULL: the default stream).
pub type CUstream = *mut c_void;
/// `CUfunction`: an opaque kernel handle.
pub type CUfunction = *mut c_void;
/// `CUevent`: an opaque event handle.
pub type CUevent = *mut c_void;
/// `CUgraphExec`: an opaque executable graph handle.
pub type CUgraphExec = *mut c_void;
/// `CU_EVENT_DEFAULT`: a timed event.
pub const CU_EVENT_DEFAULT: std::ffi::c_uint = 0;
/// `CU_STREAM_CAPTURE_STATUS_NONE`: the stream is not being captured.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;

/// `CUlaunchConfig` (`cuLaunchKernelEx`), as far as the interposer reads it.
#[repr(C)]
#[derive(Debug)]
pub struct CUlaunchConfig {
    /// `gridDimX`, `gridDimY`, `gridDimZ`.
    pub grid_dim: [std::ffi::c_uint; 3],
    /// `blockDimX`, `blockDimY`, `blockDimZ`.
    pub block_dim: [std::ffi::c_uint; 3],
    /// `sharedMemBytes`.
    pub shared_mem_bytes: std::ffi::c_uint,
    /// `hStream`: where the kernel is launched.
    pub stream: CUstream,
    /// `attrs`.
    pub attrs: *mut c_void,
    /// `numAttrs`.
    pub num_attrs: std::ffi::c_uint,
}

const _: () = assert!(std::mem::offset_of!(CUlaunchConfig, stream) == 32);

/// `cuuint64_t`.
pub type cuuint64_t = u64;
/// `CUdriverProcAddressQueryResult` (an enum in C, `int`-sized).
pub type CUdriverProcAddressQueryResult = c_int;

/// The call succeeded.
pub const CUDA_SUCCESS: CUresult = 0;
/// An argument is invalid.
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
/// Allocation failed: the device (or the container's slice of it) is full.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// The driver is not initialised (the interposer also returns it when its
/// configuration is invalid, so that CUDA is refused rather than unlimited).
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
/// An asynchronous operation has not completed yet (`cuEventQuery`).
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// A named symbol was not found.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// Unknown error (the interposer returns it when a hook panics).
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// Alignment the interposer assumes for `cuMemAllocPitch` when it reserves
/// before the call; the reservation is corrected to the real pitch after it.
pub const PITCH_ALIGNMENT: u64 = 512;

/// The granularity in which NVIDIA drivers take device memory for
/// `cuMemAlloc`, `cuMemAllocManaged`, `cuMemAllocPitch`, stream-ordered and
/// graph allocations and arrays (2 MiB, what `cuMemGetAllocationGranularity`
/// reports for device locations): an allocation is charged whole granules,
/// so many small allocations cannot take more real memory than the limit.
pub const ALLOC_GRANULARITY: u64 = 2 << 20;

/// `bytes` rounded up to [`ALLOC_GRANULARITY`] (saturating).
pub fn granular(bytes: u64) -> u64 {
    bytes
        .checked_next_multiple_of(ALLOC_GRANULARITY)
        .unwrap_or(u64::MAX)
}

/// `CUgraph`: an opaque graph handle.
pub type CUgraph = *mut c_void;
/// `CUgraphNode`: an opaque graph node handle.
pub type CUgraphNode = *mut c_void;
/// `CU_GRAPH_NODE_TYPE_GRAPH`: a child graph node.
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`: a memory allocation node.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` (`cuuint64_t`): device memory
/// reserved for graph allocations.
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (120 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    /// `poolProps`: where the allocation lives.
    pub pool_props: CUmemPoolProps,
    /// `accessDescs`.
    pub access_descs: *const c_void,
    /// `accessDescCount`.
    pub access_desc_count: usize,
    /// `bytesize`.
    pub bytesize: usize,
    /// `dptr`: the allocation's address (written by the driver).
    pub dptr: CUdeviceptr,
}

const _: () = assert!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>() == 120);

/// `CUarray`: an opaque CUDA array handle.
pub type CUarray = *mut c_void;
/// `CUmipmappedArray`: an opaque mipmapped array handle.
pub type CUmipmappedArray = *mut c_void;

/// `CUDA_ARRAY_DESCRIPTOR` (`cuArrayCreate_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    /// `Width` in elements.
    pub width: usize,
    /// `Height` in elements, 0 for a 1D array.
    pub height: usize,
    /// `Format`: a `CUarray_format`.
    pub format: c_int,
    /// `NumChannels`: 1, 2 or 4.
    pub num_channels: std::ffi::c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`cuArray3DCreate_v2`, `cuMipmappedArrayCreate`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    /// `Width` in elements.
    pub width: usize,
    /// `Height` in elements, 0 for a 1D array.
    pub height: usize,
    /// `Depth` in elements (layers of a layered array, faces of a cubemap).
    pub depth: usize,
    /// `Format`: a `CUarray_format`.
    pub format: c_int,
    /// `NumChannels`: 1, 2 or 4.
    pub num_channels: std::ffi::c_uint,
    /// `Flags`: `CUDA_ARRAY3D_*`.
    pub flags: std::ffi::c_uint,
}

/// `CUDA_ARRAY3D_LAYERED`: `depth` counts layers, which mip levels keep.
pub const CUDA_ARRAY3D_LAYERED: std::ffi::c_uint = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`: `depth` counts faces (6 per cube).
pub const CUDA_ARRAY3D_CUBEMAP: std::ffi::c_uint = 0x04;
/// `CUDA_ARRAY3D_SPARSE`: no memory until tiles are mapped in.
pub const CUDA_ARRAY3D_SPARSE: std::ffi::c_uint = 0x40;
/// `CUDA_ARRAY3D_DEFERRED_MAPPING`: no memory until it is mapped in.
pub const CUDA_ARRAY3D_DEFERRED_MAPPING: std::ffi::c_uint = 0x80;

/// `CUmemoryPool`: an opaque memory pool handle.
pub type CUmemoryPool = *mut c_void;
/// `CU_STREAM_PER_THREAD`: the per-thread default stream, as a handle.
pub const CU_STREAM_PER_THREAD: CUstream = 2 as CUstream;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (`cuuint64_t`): bytes a pool keeps
/// after frees.
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (`cuuint64_t`): device memory a
/// pool holds.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;

/// `CUmemPoolProps` (88 bytes), as far as the interposer reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    /// `CUmemAllocationType`.
    pub alloc_type: c_int,
    /// `CUmemAllocationHandleType`.
    pub handle_types: c_int,
    /// Where the pool's memory lives.
    pub location: CUmemLocation,
    /// Windows only.
    pub win32_security_attributes: *mut c_void,
    /// `maxSize` (CUDA 12.2+), `usage` and reserved bytes.
    pub rest: [u8; 64],
}

const _: () = assert!(size_of::<CUmemPoolProps>() == 88);

/// `CUmemGenericAllocationHandle`: a physical allocation (VMM).
pub type CUmemGenericAllocationHandle = u64;
/// `CU_MEM_LOCATION_TYPE_DEVICE`: the location is a device ordinal.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub type_: c_int,
    /// The device ordinal when `type_` is `CU_MEM_LOCATION_TYPE_DEVICE`.
    pub id: c_int,
}

/// `CUmemAllocationProp` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub type_: c_int,
    /// `CUmemAllocationHandleType`.
    pub requested_handle_types: c_int,
    /// Where the memory lives.
    pub location: CUmemLocation,
    /// Windows only.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compression type, RDMA capable, usage, reserved.
    pub alloc_flags: [u8; 8],
}

const _: () = assert!(size_of::<CUmemAllocationProp>() == 32);

/// `nvmlReturn_t`: 0 is success.
pub type nvmlReturn_t = c_int;
/// `nvmlDevice_t`: an opaque device handle.
pub type nvmlDevice_t = *mut c_void;
/// NVML succeeded.
pub const NVML_SUCCESS: nvmlReturn_t = 0;
/// NVML was not initialised (the interposer also returns it when its
/// configuration is invalid).
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
/// No such device, or no data (e.g. no utilisation samples since the time given).
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
/// The buffer is too small; the count says how many entries are needed.
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
/// The NVML library lacks a function.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`: room for any device's UUID string.
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 96;

/// `nvmlProcessInfo_v1_t`: what `nvmlDeviceGetComputeRunningProcesses`
/// (and the graphics and MPS lists) fill.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    /// The process, in the driver's (the host's) pid namespace.
    pub pid: std::ffi::c_uint,
    /// Device memory it holds, bytes.
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`): what the `_v2` and `_v3`
/// process lists fill.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_t {
    /// The process, in the driver's pid namespace.
    pub pid: std::ffi::c_uint,
    /// Device memory it holds, bytes.
    pub used_gpu_memory: u64,
    /// MIG GPU instance, or `NVML_VALUE_NOT_AVAILABLE`.
    pub gpu_instance_id: std::ffi::c_uint,
    /// MIG compute instance, or `NVML_VALUE_NOT_AVAILABLE`.
    pub compute_instance_id: std::ffi::c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessUtilizationSample_t {
    /// The process, in the driver's pid namespace.
    pub pid: std::ffi::c_uint,
    /// When the sample was taken: CPU time, µs (`CLOCK_REALTIME`).
    pub time_stamp: u64,
    /// Percent of the sample period a kernel of the process ran.
    pub sm_util: std::ffi::c_uint,
    /// Percent of the period its memory was read or written.
    pub mem_util: std::ffi::c_uint,
    /// Encoder utilisation, percent.
    pub enc_util: std::ffi::c_uint,
    /// Decoder utilisation, percent.
    pub dec_util: std::ffi::c_uint,
}

const _: () = {
    assert!(size_of::<nvmlProcessInfo_v1_t>() == 16);
    assert!(size_of::<nvmlProcessInfo_t>() == 24);
    assert!(size_of::<nvmlProcessUtilizationSample_t>() == 32);
};

/// `nvmlMemory_t` (bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlMemory_t {
    /// Installed memory.
    pub total: u64,
    /// Unallocated memory.
    pub free: u64,
    /// Allocated memory.
    pub used: u64,
}

/// `nvmlMemory_v2_t` (bytes); `version` is `nvmlMemory_v2`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlMemory_v2_t {
    /// Struct version.
    pub version: u32,
    /// Installed memory.
    pub total: u64,
    /// Memory reserved by the system.
    pub reserved: u64,
    /// Unallocated memory.
    pub free: u64,
    /// Allocated memory (excluding `reserved`).
    pub used: u64,
}
