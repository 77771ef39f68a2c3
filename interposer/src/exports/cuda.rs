//! The exported CUDA driver functions: every `hooked` function of
//! `cuda_api!`, each a call of the policy function `cuda_route!` names
//! for it, and the lookups the `dlsym` and `cuGetProcAddress` paths use.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::cuda::{RealFns, driver};
use crate::exports::proc_address;
use crate::policy::{compute, memory, process};
use crate::sys::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUarray, CUcontext, CUdevice, CUdeviceptr,
    CUdriverProcAddressQueryResult, CUevent, CUfunction, CUgraph, CUgraphExec, CUgraphNode,
    CUlaunchConfig, CUmemAllocationProp, CUmemGenericAllocationHandle, CUmemPoolProps,
    CUmemoryPool, CUmipmappedArray, CUresult, CUstream, cuuint64_t,
};

/// The function behind each hooked CUDA driver function (a missing name is
/// a compile error).
macro_rules! cuda_route {
    (cuInit) => {
        process::init_driver
    };
    (cuGetProcAddress) => {
        get_proc_address
    };
    (cuGetProcAddress_v2) => {
        get_proc_address_v2
    };
    (cuCtxCreate_v2) => {
        memory::context::ctx_create
    };
    (cuCtxCreate_v3) => {
        memory::context::ctx_create_v3
    };
    (cuCtxCreate_v4) => {
        memory::context::ctx_create_v4
    };
    (cuCtxDestroy_v2) => {
        memory::context::ctx_destroy
    };
    (cuDevicePrimaryCtxRetain) => {
        memory::context::primary_ctx_retain
    };
    (cuDevicePrimaryCtxRelease_v2) => {
        memory::context::primary_ctx_release
    };
    (cuMemAlloc_v2) => {
        memory::alloc::mem_alloc
    };
    (cuMemAllocManaged) => {
        memory::alloc::mem_alloc_managed
    };
    (cuMemAllocPitch_v2) => {
        memory::alloc::mem_alloc_pitch
    };
    (cuMemFree_v2) => {
        memory::alloc::mem_free
    };
    (cuMemAllocAsync) => {
        memory::pool::mem_alloc_async
    };
    (cuMemAllocAsync_ptsz) => {
        memory::pool::mem_alloc_async_ptsz
    };
    (cuMemAllocFromPoolAsync) => {
        memory::pool::mem_alloc_from_pool_async
    };
    (cuMemAllocFromPoolAsync_ptsz) => {
        memory::pool::mem_alloc_from_pool_async_ptsz
    };
    (cuMemFreeAsync) => {
        memory::pool::mem_free_async
    };
    (cuMemFreeAsync_ptsz) => {
        memory::pool::mem_free_async_ptsz
    };
    (cuMemPoolCreate) => {
        memory::pool::pool_create
    };
    (cuMemPoolDestroy) => {
        memory::pool::pool_destroy
    };
    (cuMemPoolTrimTo) => {
        memory::pool::pool_trim_to
    };
    (cuMemPoolSetAttribute) => {
        memory::pool::pool_set_attribute
    };
    (cuGraphInstantiateWithFlags) => {
        memory::graph::instantiate_with_flags
    };
    (cuGraphInstantiateWithParams) => {
        memory::graph::instantiate_with_params
    };
    (cuGraphInstantiate_v2) => {
        memory::graph::instantiate_v2
    };
    (cuGraphExecDestroy) => {
        memory::graph::exec_destroy
    };
    (cuDeviceGraphMemTrim) => {
        memory::graph::graph_mem_trim
    };
    (cuStreamSynchronize) => {
        memory::pool::stream_synchronize
    };
    (cuStreamSynchronize_ptsz) => {
        memory::pool::stream_synchronize_ptsz
    };
    (cuCtxSynchronize) => {
        memory::pool::ctx_synchronize
    };
    (cuEventSynchronize) => {
        memory::pool::event_synchronize
    };
    (cuMemCreate) => {
        memory::vmm::mem_create
    };
    (cuMemRelease) => {
        memory::vmm::mem_release
    };
    (cuMemRetainAllocationHandle) => {
        memory::vmm::retain_allocation_handle
    };
    (cuMemMap) => {
        memory::vmm::mem_map
    };
    (cuMemUnmap) => {
        memory::vmm::mem_unmap
    };
    (cuArrayCreate_v2) => {
        memory::array::array_create
    };
    (cuArray3DCreate_v2) => {
        memory::array::array_3d_create
    };
    (cuMipmappedArrayCreate) => {
        memory::array::mipmapped_array_create
    };
    (cuArrayDestroy) => {
        memory::array::array_destroy
    };
    (cuMipmappedArrayDestroy) => {
        memory::array::mipmapped_array_destroy
    };
    (cuMemGetInfo_v2) => {
        memory::info::mem_get_info
    };
    (cuDeviceTotalMem_v2) => {
        memory::info::device_total_mem
    };
    (cuLaunchKernel) => {
        compute::launch::launch_kernel
    };
    (cuLaunchKernel_ptsz) => {
        compute::launch::launch_kernel_ptsz
    };
    (cuLaunchKernelEx) => {
        compute::launch::launch_kernel_ex
    };
    (cuLaunchKernelEx_ptsz) => {
        compute::launch::launch_kernel_ex_ptsz
    };
    (cuLaunchCooperativeKernel) => {
        compute::launch::launch_cooperative_kernel
    };
    (cuLaunchCooperativeKernel_ptsz) => {
        compute::launch::launch_cooperative_kernel_ptsz
    };
    (cuGraphLaunch) => {
        compute::launch::graph_launch
    };
    (cuGraphLaunch_ptsz) => {
        compute::launch::graph_launch_ptsz
    };
}

cuda_api!(hook_exports route cuda_route;);

/// `cuGetProcAddress` (CUDA 11.3+), substituting our exports.
///
/// # Safety
///
/// As for `cuGetProcAddress`.
unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    // SAFETY: the caller's arguments, as documented.
    unsafe { proc_address::get_proc_address(symbol, pfn, cuda_version, flags, ours) }
}

/// `cuGetProcAddress_v2` (CUDA 12+), substituting our exports.
///
/// # Safety
///
/// As for `cuGetProcAddress_v2`.
unsafe fn get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    // SAFETY: the caller's arguments, as documented.
    unsafe {
        proc_address::get_proc_address_v2(symbol, pfn, cuda_version, flags, symbol_status, ours)
    }
}

/// Our export for the real driver function at `real`, if we hook it.
fn ours(real: *mut c_void) -> Option<*mut c_void> {
    driver().fns.hook_for_real(real)
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
        let fns =
            <RealFns as crate::driver::library::Table>::resolve(|name| match name.to_bytes() {
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
