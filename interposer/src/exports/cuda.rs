//! The hooked CUDA driver functions, each declared once.
//!
//! Each `hooked` line generates the exported symbol (which runs the body
//! under a panic guard) and the real function's slot in [`RealFns`]; `called`
//! lines are driver functions the hooks call but do not intercept.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::sys::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUDA_MEM_ALLOC_NODE_PARAMS, CUarray, CUcontext,
    CUdevice, CUdeviceptr, CUdriverProcAddressQueryResult, CUevent, CUfunction, CUgraph,
    CUgraphExec, CUgraphNode, CUlaunchConfig, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemPoolProps, CUmemoryPool, CUmipmappedArray, CUresult, CUstream, cuuint64_t,
};
use crate::{compute, memory, proc_address};

driver_api! {
    returns CUresult;
    hooked {
        fn cuInit(flags: c_uint) => memory::init;
        fn cuGetProcAddress(
            symbol: *const c_char,
            pfn: *mut *mut c_void,
            cuda_version: c_int,
            flags: cuuint64_t,
        ) => proc_address::get_proc_address;
        fn cuGetProcAddress_v2(
            symbol: *const c_char,
            pfn: *mut *mut c_void,
            cuda_version: c_int,
            flags: cuuint64_t,
            symbol_status: *mut CUdriverProcAddressQueryResult,
        ) => proc_address::get_proc_address_v2;
        fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => memory::context::ctx_create;
        fn cuCtxCreate_v3(
            pctx: *mut CUcontext,
            params: *mut c_void,
            count: c_int,
            flags: c_uint,
            dev: CUdevice,
        ) => memory::context::ctx_create_v3;
        fn cuCtxCreate_v4(
            pctx: *mut CUcontext,
            params: *mut c_void,
            flags: c_uint,
            dev: CUdevice,
        ) => memory::context::ctx_create_v4;
        fn cuCtxDestroy_v2(ctx: CUcontext) => memory::context::ctx_destroy;
        fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) => memory::context::primary_ctx_retain;
        fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => memory::context::primary_ctx_release;
        fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) => memory::mem_alloc;
        fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) => memory::mem_alloc_managed;
        fn cuMemAllocPitch_v2(
            dptr: *mut CUdeviceptr,
            pitch: *mut usize,
            width: usize,
            height: usize,
            element_size: c_uint,
        ) => memory::mem_alloc_pitch;
        fn cuMemFree_v2(dptr: CUdeviceptr) => memory::mem_free;
        fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => memory::pool::mem_alloc_async;
        fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => memory::pool::mem_alloc_async_ptsz;
        fn cuMemAllocFromPoolAsync(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: CUmemoryPool,
            stream: CUstream,
        ) => memory::pool::mem_alloc_from_pool_async;
        fn cuMemAllocFromPoolAsync_ptsz(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: CUmemoryPool,
            stream: CUstream,
        ) => memory::pool::mem_alloc_from_pool_async_ptsz;
        fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => memory::pool::mem_free_async;
        fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => memory::pool::mem_free_async_ptsz;
        fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) => memory::pool::pool_create;
        fn cuMemPoolDestroy(pool: CUmemoryPool) => memory::pool::pool_destroy;
        fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) => memory::pool::pool_trim_to;
        fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) => memory::pool::pool_set_attribute;
        fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) => memory::graph::instantiate_with_flags;
        fn cuGraphInstantiateWithParams(
            exec: *mut CUgraphExec,
            graph: CUgraph,
            params: *mut c_void,
        ) => memory::graph::instantiate_with_params;
        fn cuGraphInstantiate_v2(
            exec: *mut CUgraphExec,
            graph: CUgraph,
            error_node: *mut CUgraphNode,
            log: *mut c_char,
            log_size: usize,
        ) => memory::graph::instantiate_v2;
        fn cuGraphExecDestroy(exec: CUgraphExec) => memory::graph::exec_destroy;
        fn cuDeviceGraphMemTrim(dev: CUdevice) => memory::graph::graph_mem_trim;
        fn cuStreamSynchronize(stream: CUstream) => memory::pool::stream_synchronize;
        fn cuStreamSynchronize_ptsz(stream: CUstream) => memory::pool::stream_synchronize_ptsz;
        fn cuCtxSynchronize() => memory::pool::ctx_synchronize;
        fn cuEventSynchronize(event: CUevent) => memory::pool::event_synchronize;
        fn cuMemCreate(
            handle: *mut CUmemGenericAllocationHandle,
            size: usize,
            prop: *const CUmemAllocationProp,
            flags: u64,
        ) => memory::vmm::mem_create;
        fn cuMemRelease(handle: CUmemGenericAllocationHandle) => memory::vmm::mem_release;
        fn cuMemRetainAllocationHandle(
            handle: *mut CUmemGenericAllocationHandle,
            addr: *mut c_void,
        ) => memory::vmm::retain_allocation_handle;
        fn cuMemMap(
            ptr: CUdeviceptr,
            size: usize,
            offset: usize,
            handle: CUmemGenericAllocationHandle,
            flags: u64,
        ) => memory::vmm::mem_map;
        fn cuMemUnmap(ptr: CUdeviceptr, size: usize) => memory::vmm::mem_unmap;
        fn cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) => memory::array::array_create;
        fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) => memory::array::array_3d_create;
        fn cuMipmappedArrayCreate(
            array: *mut CUmipmappedArray,
            desc: *const CUDA_ARRAY3D_DESCRIPTOR,
            levels: c_uint,
        ) => memory::array::mipmapped_array_create;
        fn cuArrayDestroy(array: CUarray) => memory::array::array_destroy;
        fn cuMipmappedArrayDestroy(array: CUmipmappedArray) => memory::array::mipmapped_array_destroy;
        fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => memory::mem_get_info;
        fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => memory::device_total_mem;
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
        ) => compute::launch_kernel;
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
        ) => compute::launch_kernel_ptsz;
        fn cuLaunchKernelEx(
            config: *const CUlaunchConfig,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) => compute::launch_kernel_ex;
        fn cuLaunchKernelEx_ptsz(
            config: *const CUlaunchConfig,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) => compute::launch_kernel_ex_ptsz;
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
        ) => compute::launch_cooperative_kernel;
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
        ) => compute::launch_cooperative_kernel_ptsz;
        fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) => compute::graph_launch;
        fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) => compute::graph_launch_ptsz;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_exactly_never_by_prefix() {
        assert!(hook_for(b"cuMemAlloc_v2").is_some());
        assert_eq!(
            hook_for(b"cuMemAlloc_v2"),
            Some(exports::cuMemAlloc_v2 as *mut c_void)
        );
        for name in [
            &b"cuMemAlloc"[..],
            b"cuMemAlloc_v2_ptsz",
            b"cu",
            b"cudnnCreate",
            b"",
            b"cuMemAlloc_v",
        ] {
            assert!(
                hook_for(name).is_none(),
                "{}",
                String::from_utf8_lossy(name)
            );
        }
        for name in HOOKED {
            assert!(hook_for(name.as_bytes()).is_some(), "{name}");
        }
    }

    #[test]
    fn real_addresses_map_to_the_hook_of_the_same_symbol() {
        unsafe extern "C" fn fake_alloc(_: *mut CUdeviceptr, _: usize) -> CUresult {
            0
        }
        unsafe extern "C" fn fake_free(_: CUdeviceptr) -> CUresult {
            0
        }
        let fns = <RealFns as crate::driver::Table>::resolve(|name| match name.to_bytes() {
            b"cuMemAlloc_v2" => fake_alloc as *mut c_void,
            b"cuMemFree_v2" => fake_free as *mut c_void,
            _ => std::ptr::null_mut(),
        });
        assert!(fns.cuMemAlloc_v2.is_some() && fns.cuInit.is_none());
        assert_eq!(
            fns.hook_for_real(fake_alloc as *mut c_void),
            Some(exports::cuMemAlloc_v2 as *mut c_void)
        );
        assert_eq!(
            fns.hook_for_real(fake_free as *mut c_void),
            Some(exports::cuMemFree_v2 as *mut c_void)
        );
        assert_eq!(fns.hook_for_real(std::ptr::null_mut()), None);
    }
}
