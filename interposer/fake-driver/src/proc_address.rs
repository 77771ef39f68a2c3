//! `cuGetProcAddress` and `cuGetProcAddress_v2`: a base name resolves to the
//! versioned symbol for the caller's CUDA version, and to the `_ptsz`
//! variant with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::array::*;
use crate::base::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUresult, guard};
use crate::context::*;
use crate::devices::*;
use crate::exec::events::*;
use crate::exec::graph::*;
use crate::exec::launch::*;
use crate::exec::streams::*;
use crate::free::*;
use crate::memory::*;
use crate::ordered::*;
use crate::pool::*;
use crate::vmm::*;

/// `cuGetProcAddress` flag: resolve to the per-thread-default-stream (`_ptsz`) variant.
const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// A versioned driver symbol: available to callers built for `since` or later.
struct Versioned {
    since: c_int,
    address: *mut c_void,
}

/// The versions of a base name, oldest first, as `cuGetProcAddress` sees them.
fn versions(name: &[u8]) -> Vec<Versioned> {
    macro_rules! v {
        ($since:expr, $f:ident) => {
            Versioned {
                since: $since,
                address: $f as *mut c_void,
            }
        };
    }
    match name {
        b"cuInit" => vec![v!(2000, cuInit)],
        b"cuDriverGetVersion" => vec![v!(2020, cuDriverGetVersion)],
        b"cuDeviceGet" => vec![v!(2000, cuDeviceGet)],
        b"cuDeviceGetCount" => vec![v!(2000, cuDeviceGetCount)],
        b"cuDeviceGetName" => vec![v!(2000, cuDeviceGetName)],
        b"cuDeviceGetUuid" => vec![v!(9020, cuDeviceGetUuid), v!(11040, cuDeviceGetUuid_v2)],
        b"cuDeviceTotalMem" => vec![v!(3020, cuDeviceTotalMem_v2)],
        b"cuCtxCreate" => vec![
            v!(3020, cuCtxCreate_v2),
            v!(11040, cuCtxCreate_v3),
            v!(12050, cuCtxCreate_v4),
        ],
        b"cuDevicePrimaryCtxRetain" => vec![v!(7000, cuDevicePrimaryCtxRetain)],
        b"cuDevicePrimaryCtxRelease" => vec![v!(11000, cuDevicePrimaryCtxRelease_v2)],
        b"cuCtxDestroy" => vec![v!(4000, cuCtxDestroy_v2)],
        b"cuCtxSetCurrent" => vec![v!(4000, cuCtxSetCurrent)],
        b"cuCtxGetCurrent" => vec![v!(4000, cuCtxGetCurrent)],
        b"cuCtxGetDevice" => vec![v!(2000, cuCtxGetDevice)],
        b"cuCtxGetId" => vec![v!(12000, cuCtxGetId)],
        b"cuMemAlloc" => vec![v!(3020, cuMemAlloc_v2)],
        b"cuMemAllocManaged" => vec![v!(6000, cuMemAllocManaged)],
        b"cuMemAllocPitch" => vec![v!(3020, cuMemAllocPitch_v2)],
        b"cuMemFree" => vec![v!(3020, cuMemFree_v2)],
        b"cuMemGetInfo" => vec![v!(3020, cuMemGetInfo_v2)],
        b"cuMemGetAllocationGranularity" => vec![v!(10020, cuMemGetAllocationGranularity)],
        b"cuMemCreate" => vec![v!(10020, cuMemCreate)],
        b"cuMemRelease" => vec![v!(10020, cuMemRelease)],
        b"cuMemRetainAllocationHandle" => vec![v!(11000, cuMemRetainAllocationHandle)],
        b"cuMemAddressReserve" => vec![v!(10020, cuMemAddressReserve)],
        b"cuMemAddressFree" => vec![v!(10020, cuMemAddressFree)],
        b"cuMemMap" => vec![v!(10020, cuMemMap)],
        b"cuMemUnmap" => vec![v!(10020, cuMemUnmap)],
        b"cuMemAllocAsync" => vec![v!(11020, cuMemAllocAsync)],
        b"cuMemFreeAsync" => vec![v!(11020, cuMemFreeAsync)],
        b"cuMemAllocFromPoolAsync" => vec![v!(11020, cuMemAllocFromPoolAsync)],
        b"cuGraphCreate" => vec![v!(10000, cuGraphCreate)],
        b"cuGraphAddMemAllocNode" => vec![v!(11040, cuGraphAddMemAllocNode)],
        b"cuGraphAddMemFreeNode" => vec![v!(11040, cuGraphAddMemFreeNode)],
        b"cuGraphGetNodes" => vec![v!(10000, cuGraphGetNodes)],
        b"cuGraphNodeGetType" => vec![v!(10000, cuGraphNodeGetType)],
        b"cuGraphMemAllocNodeGetParams" => vec![v!(11040, cuGraphMemAllocNodeGetParams)],
        b"cuGraphInstantiate" => vec![
            v!(10000, cuGraphInstantiate_v2),
            v!(12000, cuGraphInstantiateWithFlags),
        ],
        b"cuGraphInstantiateWithParams" => vec![v!(12000, cuGraphInstantiateWithParams)],
        b"cuDeviceGraphMemTrim" => vec![v!(11040, cuDeviceGraphMemTrim)],
        b"cuDeviceGetGraphMemAttribute" => vec![v!(11040, cuDeviceGetGraphMemAttribute)],
        b"cuArrayCreate" => vec![v!(3020, cuArrayCreate_v2)],
        b"cuArray3DCreate" => vec![v!(3020, cuArray3DCreate_v2)],
        b"cuMipmappedArrayCreate" => vec![v!(5000, cuMipmappedArrayCreate)],
        b"cuArrayDestroy" => vec![v!(2000, cuArrayDestroy)],
        b"cuMipmappedArrayDestroy" => vec![v!(5000, cuMipmappedArrayDestroy)],
        b"cuMemPoolCreate" => vec![v!(11020, cuMemPoolCreate)],
        b"cuMemPoolDestroy" => vec![v!(11020, cuMemPoolDestroy)],
        b"cuMemPoolTrimTo" => vec![v!(11020, cuMemPoolTrimTo)],
        b"cuMemPoolSetAttribute" => vec![v!(11020, cuMemPoolSetAttribute)],
        b"cuMemPoolGetAttribute" => vec![v!(11020, cuMemPoolGetAttribute)],
        b"cuDeviceGetDefaultMemPool" => vec![v!(11020, cuDeviceGetDefaultMemPool)],
        b"cuDeviceGetMemPool" => vec![v!(11020, cuDeviceGetMemPool)],
        b"cuDeviceSetMemPool" => vec![v!(11020, cuDeviceSetMemPool)],
        b"cuGetProcAddress" => vec![v!(11030, cuGetProcAddress), v!(12000, cuGetProcAddress_v2)],
        b"cuLaunchKernel" => vec![v!(4000, cuLaunchKernel)],
        b"cuLaunchKernelEx" => vec![v!(11080, cuLaunchKernelEx)],
        b"cuLaunchCooperativeKernel" => vec![v!(9000, cuLaunchCooperativeKernel)],
        b"cuGraphLaunch" => vec![v!(10000, cuGraphLaunch)],
        b"cuStreamCreate" => vec![v!(2000, cuStreamCreate)],
        b"cuStreamDestroy" => vec![v!(4000, cuStreamDestroy_v2)],
        b"cuStreamSynchronize" => vec![v!(2000, cuStreamSynchronize)],
        b"cuStreamBeginCapture" => vec![v!(10010, cuStreamBeginCapture_v2)],
        b"cuStreamEndCapture" => vec![v!(10000, cuStreamEndCapture)],
        b"cuStreamIsCapturing" => vec![v!(10000, cuStreamIsCapturing)],
        b"cuGraphInstantiateWithFlags" => vec![v!(11040, cuGraphInstantiateWithFlags)],
        b"cuGraphDestroy" => vec![v!(10000, cuGraphDestroy)],
        b"cuGraphExecDestroy" => vec![v!(10000, cuGraphExecDestroy)],
        b"cuCtxSynchronize" => vec![v!(2000, cuCtxSynchronize)],
        b"cuEventCreate" => vec![v!(2000, cuEventCreate)],
        b"cuEventDestroy" => vec![v!(4000, cuEventDestroy_v2)],
        b"cuEventRecord" => vec![v!(2000, cuEventRecord)],
        b"cuEventQuery" => vec![v!(2000, cuEventQuery)],
        b"cuEventSynchronize" => vec![v!(2000, cuEventSynchronize)],
        b"cuEventElapsedTime" => vec![v!(2000, cuEventElapsedTime)],
        _ => Vec::new(),
    }
}

/// The `_ptsz` variant of a base name, for `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
fn per_thread(name: &[u8]) -> Option<*mut c_void> {
    match name {
        b"cuMemAllocAsync" => Some(cuMemAllocAsync_ptsz as *mut c_void),
        b"cuMemFreeAsync" => Some(cuMemFreeAsync_ptsz as *mut c_void),
        b"cuMemAllocFromPoolAsync" => Some(cuMemAllocFromPoolAsync_ptsz as *mut c_void),
        b"cuLaunchKernel" => Some(cuLaunchKernel_ptsz as *mut c_void),
        b"cuLaunchKernelEx" => Some(cuLaunchKernelEx_ptsz as *mut c_void),
        b"cuLaunchCooperativeKernel" => Some(cuLaunchCooperativeKernel_ptsz as *mut c_void),
        b"cuGraphLaunch" => Some(cuGraphLaunch_ptsz as *mut c_void),
        b"cuStreamSynchronize" => Some(cuStreamSynchronize_ptsz as *mut c_void),
        b"cuStreamIsCapturing" => Some(cuStreamIsCapturing_ptsz as *mut c_void),
        b"cuEventRecord" => Some(cuEventRecord_ptsz as *mut c_void),
        _ => None,
    }
}

/// The lookup shared by both entry points; returns the query status.
///
/// # Safety
///
/// `symbol` is NULL or NUL-terminated; `pfn` is NULL or valid for writes.
unsafe fn lookup(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> (CUresult, c_int) {
    if symbol.is_null() || pfn.is_null() {
        return (
            CUDA_ERROR_INVALID_VALUE,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        );
    }
    // SAFETY: non-NULL and NUL-terminated per the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let versions = versions(name);
    let chosen = versions.iter().rev().find(|v| v.since <= cuda_version);
    let (rc, status, address) = match chosen {
        Some(v) => {
            let per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0)
                .then(|| per_thread(name))
                .flatten();
            (
                CUDA_SUCCESS,
                CU_GET_PROC_ADDRESS_SUCCESS,
                per_thread.unwrap_or(v.address),
            )
        }
        None if versions.is_empty() => (
            CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            std::ptr::null_mut(),
        ),
        None => (
            CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            std::ptr::null_mut(),
        ),
    };
    // SAFETY: checked non-NULL above.
    unsafe { pfn.write(address) };
    (rc, status)
}

/// `cuGetProcAddress` (CUDA 11.3+): resolves a base name to the versioned
/// symbol for `cuda_version`.
///
/// # Safety
///
/// `symbol` is NULL or NUL-terminated; `pfn` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's arguments, as documented.
    guard(
        || match unsafe { lookup(symbol, pfn, cuda_version, flags) } {
            (CUDA_SUCCESS, _) => Ok(()),
            (rc, _) => Err(rc),
        },
    )
}

/// `cuGetProcAddress_v2` (CUDA 12+): as `cuGetProcAddress`, and reports why
/// a lookup failed in `symbol_status`.
///
/// # Safety
///
/// As `cuGetProcAddress`; `symbol_status` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller's arguments, as documented.
        let (rc, status) = unsafe { lookup(symbol, pfn, cuda_version, flags) };
        if !symbol_status.is_null() {
            // SAFETY: non-NULL, valid for writes per the caller.
            unsafe { symbol_status.write(status) };
        }
        if rc == CUDA_SUCCESS { Ok(()) } else { Err(rc) }
    })
}
