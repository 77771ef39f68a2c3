//! Graph memory: the allocations of executable graphs.
//!
//! A graph's memory allocation nodes (`cuGraphAddMemAllocNode`, the generic
//! `cuGraphAddNode`, or `cuMemAllocAsync` on a captured stream) take no
//! memory until an executable graph made from it is launched, and the
//! driver then keeps that memory for the executable's life, and after it in
//! the device's graph memory cache until `cuDeviceGraphMemTrim`. So the
//! charge is taken when the graph is **instantiated**: the sum of its
//! allocation nodes, each in whole granules, found by walking the graph
//! through the driver (`cuGraphGetNodes`, `cuGraphNodeGetType`,
//! `cuGraphMemAllocNodeGetParams`, child graphs too), so that nodes from
//! any path are seen. It is an upper bound of what any launch of it can
//! back (free nodes let the driver reuse memory within a launch), it makes
//! the instantiation fail with `CUDA_ERROR_OUT_OF_MEMORY` rather than a
//! later launch, and it is not taken for graphs that are never instantiated.
//! Charging at node creation would charge graphs that never run and could
//! not follow an executable that outlives its graph; charging at launch
//! would need a hook on the launch path.
//!
//! Each device's graph memory is a store (`accounting/stores.rs`): executables
//! are its live bytes; what the driver reports it reserves
//! (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`) is charged while it exceeds
//! them, e.g. after an executable is destroyed until the memory is trimmed,
//! and a new executable first uses that cached memory.

use tessera_vgpu_region::MAX_DEVICES;

use crate::accounting::keys::Key;
use crate::accounting::stores::StoreId;
use crate::log::DEBUG;
use crate::policy::process::{State, enforcer_or_return, state};
use crate::sys::{
    CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_MEM_LOCATION_TYPE_DEVICE,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_MEM_ALLOC_NODE_PARAMS, CUDA_SUCCESS, CUdevice, CUgraph,
    CUgraphExec, CUgraphNode, CUresult, granular,
};

/// Child graphs deeper than this are not followed (the driver nests few).
const MAX_DEPTH: usize = 16;

/// Adds the allocation nodes of `graph` (and its child graphs) to `per_dev`,
/// each in whole granules.
fn walk(graph: CUgraph, depth: usize, per_dev: &mut [u64; MAX_DEVICES]) {
    let fns = &crate::driver::cuda::driver().fns;
    if depth > MAX_DEPTH
        || fns.cuGraphGetNodes.is_none()
        || fns.cuGraphNodeGetType.is_none()
        || fns.cuGraphMemAllocNodeGetParams.is_none()
    {
        return;
    }
    let mut count: usize = 0;
    if real!(cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count)) != CUDA_SUCCESS {
        return;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    if count == 0 || real!(cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count)) != CUDA_SUCCESS {
        return;
    }
    for &node in nodes.iter().take(count) {
        let mut kind = 0;
        if real!(cuGraphNodeGetType(node, &mut kind)) != CUDA_SUCCESS {
            continue;
        }
        if kind == CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            // SAFETY: all-zero bytes are a valid value of this plain C struct.
            let mut params: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
            if real!(cuGraphMemAllocNodeGetParams(node, &mut params)) != CUDA_SUCCESS {
                continue;
            }
            let location = params.pool_props.location;
            if location.type_ == CU_MEM_LOCATION_TYPE_DEVICE
                && let Some(total) = usize::try_from(location.id)
                    .ok()
                    .and_then(|dev| per_dev.get_mut(dev))
            {
                *total = total.saturating_add(granular(params.bytesize as u64));
            }
        } else if kind == CU_GRAPH_NODE_TYPE_GRAPH && fns.cuGraphChildGraphNodeGetGraph.is_some() {
            let mut child: CUgraph = std::ptr::null_mut();
            if real!(cuGraphChildGraphNodeGetGraph(node, &mut child)) == CUDA_SUCCESS {
                walk(child, depth + 1, per_dev);
            }
        }
    }
}

/// Charges an instantiation of `graph`: its allocation nodes on each device,
/// taken from that device's graph memory store before `call` instantiates.
///
/// # Safety
///
/// `exec` is what `call` writes (the caller's argument).
unsafe fn instantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let enforcer = enforcer_or_return!(call());
    let mut per_dev = [0u64; MAX_DEVICES];
    walk(graph, 0, &mut per_dev);
    let mut taken = Vec::new();
    for (dev, &bytes) in per_dev.iter().enumerate().filter(|(_, b)| **b > 0) {
        match enforcer.store_take(StoreId::Graph(dev), dev as CUdevice, bytes) {
            Ok(Some(t)) => taken.push((dev, t)),
            Ok(None) => {}
            Err(rc) => {
                for (_, t) in taken {
                    enforcer.store_untake(t);
                }
                return rc;
            }
        }
    }
    let rc = call();
    if rc != CUDA_SUCCESS {
        for (_, t) in taken {
            enforcer.store_untake(t);
        }
        return rc;
    }
    if !taken.is_empty() {
        // SAFETY: the driver succeeded, so `exec` is valid and written.
        let created = unsafe { *exec } as u64;
        log!(DEBUG, "graph exec {created:#x}: allocations {per_dev:?}");
        for (dev, t) in taken {
            enforcer.store_track(Key::GraphExec(created, dev as u8), t);
        }
    }
    CUDA_SUCCESS
}

/// `cuGraphInstantiateWithFlags`, charged the graph's allocations.
///
/// # Safety
///
/// As for `cuGraphInstantiateWithFlags`.
pub(crate) unsafe fn instantiate_with_flags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    let call = || real!(cuGraphInstantiateWithFlags(exec, graph, flags));
    // SAFETY: `exec` is the caller's, which `call` writes.
    unsafe { instantiate(exec, graph, call) }
}

/// `cuGraphInstantiateWithParams`, charged the graph's allocations.
///
/// # Safety
///
/// As for `cuGraphInstantiateWithParams`.
pub(crate) unsafe fn instantiate_with_params(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut std::ffi::c_void,
) -> CUresult {
    let call = || real!(cuGraphInstantiateWithParams(exec, graph, params));
    // SAFETY: `exec` is the caller's, which `call` writes.
    unsafe { instantiate(exec, graph, call) }
}

/// `cuGraphInstantiate_v2` (CUDA 11 programs), charged the graph's
/// allocations.
///
/// # Safety
///
/// As for `cuGraphInstantiate_v2`.
pub(crate) unsafe fn instantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut std::ffi::c_char,
    log_size: usize,
) -> CUresult {
    let call = || {
        real!(cuGraphInstantiate_v2(
            exec, graph, error_node, log, log_size
        ))
    };
    // SAFETY: `exec` is the caller's, which `call` writes.
    unsafe { instantiate(exec, graph, call) }
}

/// `cuGraphExecDestroy`: the executable's allocations go back to its
/// devices' graph memory, which stays charged while the driver keeps it.
///
/// # Safety
///
/// None beyond `cuGraphExecDestroy`'s.
pub(crate) unsafe fn exec_destroy(exec: CUgraphExec) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuGraphExecDestroy(exec)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer)) = (rc, state()) {
        for dev in 0..MAX_DEVICES as u8 {
            enforcer.freed(Key::GraphExec(exec as u64, dev), || CUDA_SUCCESS);
        }
    }
    rc
}

/// `cuDeviceGraphMemTrim`: the device's graph memory charge follows what
/// the driver still reserves.
///
/// # Safety
///
/// None beyond `cuDeviceGraphMemTrim`'s.
pub(crate) unsafe fn graph_mem_trim(dev: CUdevice) -> CUresult {
    let rc = match state() {
        State::Refused => return CUDA_ERROR_NOT_INITIALIZED,
        _ => real!(cuDeviceGraphMemTrim(dev)),
    };
    if let (CUDA_SUCCESS, State::Enforcing(enforcer), Ok(dev)) = (rc, state(), usize::try_from(dev))
    {
        let _ = enforcer.store_resync(StoreId::Graph(dev));
    }
    rc
}
