//! The CUDA driver: every function the interposer hooks or calls, declared
//! once (`cuda_api!`), the table of the real ones and where it is loaded from.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::driver::library::{Library, Spec};
use crate::sys::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUDA_MEM_ALLOC_NODE_PARAMS, CUarray, CUcontext,
    CUdevice, CUdeviceptr, CUdriverProcAddressQueryResult, CUevent, CUfunction, CUgraph,
    CUgraphExec, CUgraphNode, CUlaunchConfig, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemPoolProps, CUmemoryPool, CUmipmappedArray, CUresult, CUstream, cuuint64_t,
};

/// Overrides where the real CUDA driver is loaded from (a path or a soname).
/// Tests point it at the fake driver; production leaves it unset.
pub(crate) const TESSERA_REAL_LIBCUDA: &str = "TESSERA_REAL_LIBCUDA";

/// Calls `$m!` with the CUDA driver API the interposer touches, each
/// function declared once: `hooked` functions (with argument names) are
/// exported by the interposer and found in the real driver; `called` ones
/// are only found there (the hooks call them). The caller's own tokens
/// (`$args`) come first.
///
/// `real_fns!` (below) makes the table of real functions from it,
/// `hook_exports!` (`exports/generate.rs`) the exported symbols.
macro_rules! cuda_api {
    ($m:ident $($args:tt)*) => {
        $m! {
            $($args)*
            returns CUresult;
            hooked {
                fn cuInit(flags: c_uint);
                fn cuGetProcAddress(
                    symbol: *const c_char,
                    pfn: *mut *mut c_void,
                    cuda_version: c_int,
                    flags: cuuint64_t,
                );
                fn cuGetProcAddress_v2(
                    symbol: *const c_char,
                    pfn: *mut *mut c_void,
                    cuda_version: c_int,
                    flags: cuuint64_t,
                    symbol_status: *mut CUdriverProcAddressQueryResult,
                );
                fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
                fn cuCtxCreate_v3(
                    pctx: *mut CUcontext,
                    params: *mut c_void,
                    count: c_int,
                    flags: c_uint,
                    dev: CUdevice,
                );
                fn cuCtxCreate_v4(
                    pctx: *mut CUcontext,
                    params: *mut c_void,
                    flags: c_uint,
                    dev: CUdevice,
                );
                fn cuCtxDestroy_v2(ctx: CUcontext);
                fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice);
                fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
                fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize);
                fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
                fn cuMemAllocPitch_v2(
                    dptr: *mut CUdeviceptr,
                    pitch: *mut usize,
                    width: usize,
                    height: usize,
                    element_size: c_uint,
                );
                fn cuMemFree_v2(dptr: CUdeviceptr);
                fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream);
                fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream);
                fn cuMemAllocFromPoolAsync(
                    dptr: *mut CUdeviceptr,
                    bytesize: usize,
                    pool: CUmemoryPool,
                    stream: CUstream,
                );
                fn cuMemAllocFromPoolAsync_ptsz(
                    dptr: *mut CUdeviceptr,
                    bytesize: usize,
                    pool: CUmemoryPool,
                    stream: CUstream,
                );
                fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream);
                fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream);
                fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps);
                fn cuMemPoolDestroy(pool: CUmemoryPool);
                fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize);
                fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void);
                fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64);
                fn cuGraphInstantiateWithParams(
                    exec: *mut CUgraphExec,
                    graph: CUgraph,
                    params: *mut c_void,
                );
                fn cuGraphInstantiate_v2(
                    exec: *mut CUgraphExec,
                    graph: CUgraph,
                    error_node: *mut CUgraphNode,
                    log: *mut c_char,
                    log_size: usize,
                );
                fn cuGraphExecDestroy(exec: CUgraphExec);
                fn cuDeviceGraphMemTrim(dev: CUdevice);
                fn cuStreamSynchronize(stream: CUstream);
                fn cuStreamSynchronize_ptsz(stream: CUstream);
                fn cuCtxSynchronize();
                fn cuEventSynchronize(event: CUevent);
                fn cuMemCreate(
                    handle: *mut CUmemGenericAllocationHandle,
                    size: usize,
                    prop: *const CUmemAllocationProp,
                    flags: u64,
                );
                fn cuMemRelease(handle: CUmemGenericAllocationHandle);
                fn cuMemRetainAllocationHandle(
                    handle: *mut CUmemGenericAllocationHandle,
                    addr: *mut c_void,
                );
                fn cuMemMap(
                    ptr: CUdeviceptr,
                    size: usize,
                    offset: usize,
                    handle: CUmemGenericAllocationHandle,
                    flags: u64,
                );
                fn cuMemUnmap(ptr: CUdeviceptr, size: usize);
                fn cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR);
                fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR);
                fn cuMipmappedArrayCreate(
                    array: *mut CUmipmappedArray,
                    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
                    levels: c_uint,
                );
                fn cuArrayDestroy(array: CUarray);
                fn cuMipmappedArrayDestroy(array: CUmipmappedArray);
                fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
                fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
                fn cuLaunchKernel(
                    f: CUfunction,
                    grid_x: c_uint,
                    grid_y: c_uint,
                    grid_z: c_uint,
                    block_x: c_uint,
                    block_y: c_uint,
                    block_z: c_uint,
                    shared_mem_bytes: c_uint,
                    stream: CUstream,
                    params: *mut *mut c_void,
                    extra: *mut *mut c_void,
                );
                fn cuLaunchKernel_ptsz(
                    f: CUfunction,
                    grid_x: c_uint,
                    grid_y: c_uint,
                    grid_z: c_uint,
                    block_x: c_uint,
                    block_y: c_uint,
                    block_z: c_uint,
                    shared_mem_bytes: c_uint,
                    stream: CUstream,
                    params: *mut *mut c_void,
                    extra: *mut *mut c_void,
                );
                fn cuLaunchKernelEx(
                    config: *const CUlaunchConfig,
                    f: CUfunction,
                    params: *mut *mut c_void,
                    extra: *mut *mut c_void,
                );
                fn cuLaunchKernelEx_ptsz(
                    config: *const CUlaunchConfig,
                    f: CUfunction,
                    params: *mut *mut c_void,
                    extra: *mut *mut c_void,
                );
                fn cuLaunchCooperativeKernel(
                    f: CUfunction,
                    grid_x: c_uint,
                    grid_y: c_uint,
                    grid_z: c_uint,
                    block_x: c_uint,
                    block_y: c_uint,
                    block_z: c_uint,
                    shared_mem_bytes: c_uint,
                    stream: CUstream,
                    params: *mut *mut c_void,
                );
                fn cuLaunchCooperativeKernel_ptsz(
                    f: CUfunction,
                    grid_x: c_uint,
                    grid_y: c_uint,
                    grid_z: c_uint,
                    block_x: c_uint,
                    block_y: c_uint,
                    block_z: c_uint,
                    shared_mem_bytes: c_uint,
                    stream: CUstream,
                    params: *mut *mut c_void,
                );
                fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
                fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream);
            }
            called {
                fn cuCtxGetDevice(*mut CUdevice);
                fn cuCtxGetCurrent(*mut CUcontext);
                fn cuCtxGetId(CUcontext, *mut u64);
                fn cuEventCreate(*mut CUevent, c_uint);
                fn cuEventRecord(CUevent, CUstream);
                fn cuEventRecord_ptsz(CUevent, CUstream);
                fn cuEventQuery(CUevent);
                fn cuEventElapsedTime(*mut f32, CUevent, CUevent);
                fn cuStreamIsCapturing(CUstream, *mut c_int);
                fn cuStreamIsCapturing_ptsz(CUstream, *mut c_int);
                fn cuMemPoolGetAttribute(CUmemoryPool, c_int, *mut c_void);
                fn cuDeviceGetMemPool(*mut CUmemoryPool, CUdevice);
                fn cuGraphGetNodes(CUgraph, *mut CUgraphNode, *mut usize);
                fn cuGraphNodeGetType(CUgraphNode, *mut c_int);
                fn cuGraphMemAllocNodeGetParams(CUgraphNode, *mut CUDA_MEM_ALLOC_NODE_PARAMS);
                fn cuGraphChildGraphNodeGetGraph(CUgraphNode, *mut CUgraph);
                fn cuDeviceGetGraphMemAttribute(CUdevice, c_int, *mut c_void);
                fn cuDeviceGetCount(*mut c_int);
                fn cuDeviceGet(*mut CUdevice, c_int);
                fn cuDeviceGetUuid(*mut [u8; 16], CUdevice);
                fn cuDeviceGetUuid_v2(*mut [u8; 16], CUdevice);
            }
        }
    };
}

cuda_api!(real_fns);

const LIBCUDA: Spec = Spec {
    name: "libcuda.so.1",
    env: TESSERA_REAL_LIBCUDA,
    candidates: &[
        c"libcuda.so.1",
        c"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        c"/usr/lib64/libcuda.so.1",
        c"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    ],
};

static CUDA: OnceLock<Library<RealFns>> = OnceLock::new();

/// The real CUDA driver, loaded on first use.
pub(crate) fn driver() -> &'static Library<RealFns> {
    crate::driver::library::loaded(&CUDA, &LIBCUDA)
}

/// The real CUDA driver if it is loaded or can be loaded without re-entering
/// a library's initialisation on this thread.
#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))]
pub(crate) fn driver_unless_loading() -> Option<&'static Library<RealFns>> {
    crate::driver::library::loaded_unless_loading(&CUDA, &LIBCUDA)
}

/// Calls a real CUDA driver function (`CUDA_ERROR_NOT_FOUND` if missing).
macro_rules! real {
    ($($call:tt)*) => {
        call_real!($crate::driver::cuda::driver(), $crate::driver::library::missing, $($call)*)
    };
}
