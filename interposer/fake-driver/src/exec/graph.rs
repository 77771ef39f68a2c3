//! Graphs: built by stream capture (`cuStreamBeginCapture_v2`,
//! `cuStreamEndCapture`; captured launches and `cuMemAllocAsync` /
//! `cuMemFreeAsync` become nodes) or explicitly (`cuGraphCreate`,
//! `cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode`); inspected
//! (`cuGraphGetNodes`, `cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`);
//! instantiated (`cuGraphInstantiateWithFlags`, `cuGraphInstantiateWithParams`,
//! `cuGraphInstantiate_v2`), launched and destroyed.
//!
//! Graph memory, as on a real GPU: the addresses of a graph's allocations
//! are fixed when the node is made; device memory backs them when an
//! executable graph is first launched (every allocation node, in whole
//! granules, for as long as the executable exists); it is reserved per
//! device, reused by later launches and kept when an executable is destroyed
//! until `cuDeviceGraphMemTrim` gives back what no executable uses.
//! `cuDeviceGetGraphMemAttribute` reports it.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use crate::base::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, PER_THREAD_CALLS, granular,
    guard, write,
};
use crate::devices::{device, initialized, physical};
use crate::exec::model::{
    CUDA_ERROR_INVALID_HANDLE, CUstream, Exec, Executable, Graph, Node, new_handle, with_exec,
};
use crate::exec::streams::{enqueue, resolve};
use crate::memory::new_address;

const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;
const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

type CUgraph = *mut c_void;
type CUgraphNode = *mut c_void;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (120 bytes), as far as the fake reads it.
#[repr(C)]
pub struct MemAllocNodeParams {
    alloc_type: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    pool_rest: [u8; 72],
    access_descs: *const c_void,
    access_desc_count: usize,
    bytesize: usize,
    dptr: u64,
}

const _: () = assert!(size_of::<MemAllocNodeParams>() == 120);

fn graph_mut(exec: &mut Exec, graph: CUgraph) -> Result<&mut Graph, CUresult> {
    exec.graphs
        .get_mut(&(graph as usize))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

fn node(exec: &Exec, node: CUgraphNode) -> Result<Node, CUresult> {
    exec.graphs
        .values()
        .flat_map(|g| g.nodes.iter())
        .find(|(handle, _)| *handle == node as usize)
        .map(|(_, n)| *n)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// An allocation node for `bytesize` bytes on `dev`: its address.
fn alloc_node(exec: &mut Exec, dev: usize, bytesize: u64) -> Result<(Node, u64), CUresult> {
    let bytes = granular(bytesize).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    if bytesize == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = new_address(bytes);
    exec.graph_pointers.insert(ptr);
    Ok((Node::Alloc { dev, bytesize, ptr }, ptr))
}

/// `cuMemAllocAsync` on a stream being captured: an allocation node of the
/// captured graph; `None` when the stream is not captured.
pub(crate) fn capture_alloc(
    stream: CUstream,
    per_thread: bool,
    dev: usize,
    bytesize: u64,
) -> Result<Option<u64>, CUresult> {
    with_exec(|exec| {
        let (key, _) = resolve(exec, stream, per_thread)?;
        if exec.streams.get(&key).is_none_or(|s| s.capture.is_none()) {
            return Ok(None);
        }
        let (node, ptr) = alloc_node(exec, dev, bytesize)?;
        if let Some(graph) = exec.streams.get_mut(&key).and_then(|s| s.capture.as_mut()) {
            graph.add(node);
        }
        Ok(Some(ptr))
    })
}

/// `cuMemFreeAsync` on a stream being captured: a free node; false when the
/// stream is not captured.
pub(crate) fn capture_free(stream: CUstream, per_thread: bool) -> Result<bool, CUresult> {
    with_exec(|exec| {
        let (key, _) = resolve(exec, stream, per_thread)?;
        match exec.streams.get_mut(&key).and_then(|s| s.capture.as_mut()) {
            Some(graph) => {
                graph.add(Node::Free);
                Ok(true)
            }
            None => Ok(false),
        }
    })
}

/// Whether `ptr` is a graph allocation (freed outside a graph: nothing to do
/// here, its memory belongs to its executable graph).
pub(crate) fn is_graph_pointer(ptr: u64) -> bool {
    with_exec(|exec| Ok(exec.graph_pointers.contains(&ptr))).unwrap_or(false)
}

/// `cuGraphCreate`.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(out: *mut CUgraph, _flags: u32) -> CUresult {
    guard(|| {
        initialized()?;
        let handle = new_handle();
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, handle as CUgraph) }?;
        with_exec(|exec| {
            exec.graphs.insert(handle, Graph::default());
            Ok(())
        })
    })
}

/// `cuGraphAddMemAllocNode`: fixes the allocation's address in
/// `params->dptr`; the memory comes when an executable graph is launched.
/// Dependencies are not modelled.
///
/// # Safety
///
/// `out` is NULL or valid for writes; `params` is NULL or valid for reads
/// and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    _dependencies: *const CUgraphNode,
    _count: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    guard(|| {
        initialized()?;
        // SAFETY: NULL or valid per the caller.
        let p = unsafe { params.as_mut() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if out.is_null()
            || p.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED
            || p.location_type != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = device(p.location_id)?;
        let (handle, ptr) = with_exec(|exec| {
            graph_mut(exec, graph)?;
            let (node, ptr) = alloc_node(exec, dev, p.bytesize as u64)?;
            Ok((graph_mut(exec, graph)?.add(node), ptr))
        })?;
        p.dptr = ptr;
        // SAFETY: checked non-NULL above.
        unsafe { write(out, handle as CUgraphNode) }
    })
}

/// `cuGraphAddMemFreeNode`.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    _dependencies: *const CUgraphNode,
    _count: usize,
    dptr: u64,
) -> CUresult {
    guard(|| {
        initialized()?;
        let handle = with_exec(|exec| {
            if !exec.graph_pointers.contains(&dptr) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok(graph_mut(exec, graph)?.add(Node::Free))
        })?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, handle as CUgraphNode) }
    })
}

/// `cuGraphGetNodes`: with `nodes` NULL, the count; else up to `*count`
/// nodes (the rest NULL) and the number written.
///
/// # Safety
///
/// `count` is NULL or valid for reads and writes; `nodes` is NULL or valid
/// for `*count` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    guard(|| {
        initialized()?;
        if count.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handles: Vec<usize> = with_exec(|exec| {
            Ok(graph_mut(exec, graph)?
                .nodes
                .iter()
                .map(|(h, _)| *h)
                .collect())
        })?;
        if nodes.is_null() {
            // SAFETY: checked non-NULL above.
            unsafe { count.write(handles.len()) };
            return Ok(());
        }
        // SAFETY: checked non-NULL above; valid for reads per the caller.
        let room = unsafe { count.read() };
        for i in 0..room {
            // SAFETY: `nodes` is valid for `room` writes per the caller.
            unsafe {
                nodes
                    .add(i)
                    .write(handles.get(i).map_or(std::ptr::null_mut(), |&h| h as _))
            };
        }
        // SAFETY: as above.
        unsafe { count.write(room.min(handles.len())) };
        Ok(())
    })
}

/// `cuGraphNodeGetType`: kernel, memory allocation or memory free.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(n: CUgraphNode, out: *mut c_int) -> CUresult {
    guard(|| {
        initialized()?;
        let kind = match with_exec(|exec| node(exec, n))? {
            Node::Kernel => CU_GRAPH_NODE_TYPE_KERNEL,
            Node::Alloc { .. } => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            Node::Free => CU_GRAPH_NODE_TYPE_MEM_FREE,
        };
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(out, kind) }
    })
}

/// `cuGraphMemAllocNodeGetParams`: the pool properties' location, the size
/// asked for and the address.
///
/// # Safety
///
/// `params` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    n: CUgraphNode,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    guard(|| {
        initialized()?;
        let Node::Alloc { dev, bytesize, ptr } = with_exec(|exec| node(exec, n))? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        let p = MemAllocNodeParams {
            alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            handle_types: 0,
            location_type: CU_MEM_LOCATION_TYPE_DEVICE,
            location_id: dev as c_int,
            pool_rest: [0; 72],
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: bytesize as usize,
            dptr: ptr,
        };
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(params, p) }
    })
}

fn instantiate(out: *mut *mut c_void, graph: CUgraph) -> Result<(), CUresult> {
    initialized()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let handle = with_exec(|exec| {
        let g = graph_mut(exec, graph)?;
        let mut allocations: Vec<(usize, u64)> = Vec::new();
        for (_, node) in &g.nodes {
            if let Node::Alloc { dev, bytesize, .. } = *node {
                let bytes = granular(bytesize).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
                match allocations.iter_mut().find(|(d, _)| *d == dev) {
                    Some((_, total)) => *total += bytes,
                    None => allocations.push((dev, bytes)),
                }
            }
        }
        let executable = Executable {
            duration: g.duration,
            allocations,
            backed: false,
        };
        let handle = new_handle();
        exec.execs.insert(handle, executable);
        Ok(handle)
    })?;
    // SAFETY: checked non-NULL above.
    unsafe { write(out, handle as *mut c_void) }
}

/// `cuGraphInstantiateWithFlags`.
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    out: *mut *mut c_void,
    graph: CUgraph,
    _flags: u64,
) -> CUresult {
    guard(|| instantiate(out, graph))
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    flags: u64,
    upload_stream: CUstream,
    error_node: CUgraphNode,
    result: c_int,
}

/// `cuGraphInstantiateWithParams`: reports success in `result_out`.
///
/// # Safety
///
/// `out` is NULL or valid for writes; `params` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    out: *mut *mut c_void,
    graph: CUgraph,
    params: *mut InstantiateParams,
) -> CUresult {
    guard(|| {
        // SAFETY: NULL or valid per the caller.
        let params = unsafe { params.as_mut() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        instantiate(out, graph)?;
        params.result = 0;
        Ok(())
    })
}

/// `cuGraphInstantiate_v2` (CUDA 11 programs).
///
/// # Safety
///
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    out: *mut *mut c_void,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    guard(|| instantiate(out, graph))
}

/// Backs an executable's allocations with device memory at its first launch.
fn back(exec: &mut Exec, handle: usize) -> Result<u64, CUresult> {
    let e = exec
        .execs
        .get_mut(&handle)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if e.backed {
        return Ok(e.duration);
    }
    let physical = physical()?;
    let mut done: Vec<(usize, u64, u64)> = Vec::new();
    for &(dev, bytes) in &e.allocations {
        let memory = exec.graph_memory.entry(dev).or_default();
        let grow = (memory.used + bytes).saturating_sub(memory.reserved);
        if !physical.reserve(dev, grow) {
            for (dev, bytes, grow) in done {
                physical.release(dev, grow);
                let m = exec.graph_memory.entry(dev).or_default();
                m.reserved -= grow;
                m.used -= bytes;
            }
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        memory.reserved += grow;
        memory.used += bytes;
        memory.reserved_high = memory.reserved_high.max(memory.reserved);
        memory.used_high = memory.used_high.max(memory.used);
        done.push((dev, bytes, grow));
    }
    let e = exec
        .execs
        .get_mut(&handle)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    e.backed = true;
    Ok(e.duration)
}

fn graph_launch(exec_handle: *mut c_void, stream: CUstream, per_thread: bool) -> CUresult {
    if per_thread {
        PER_THREAD_CALLS.fetch_add(1, Ordering::Relaxed);
    }
    guard(|| {
        initialized()?;
        let duration = with_exec(|exec| back(exec, exec_handle as usize))?;
        enqueue(stream, per_thread, duration)
    })
}

/// `cuGraphLaunch`: backs the graph's allocations (first launch) and
/// occupies the device for the captured launches' total.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: *mut c_void, stream: CUstream) -> CUresult {
    graph_launch(exec, stream, false)
}

/// `cuGraphLaunch_ptsz`; counted.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: CUstream) -> CUresult {
    graph_launch(exec, stream, true)
}

/// `cuGraphDestroy`.
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard(|| {
        with_exec(|exec| {
            exec.graphs
                .remove(&(graph as usize))
                .map(|_| ())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)
        })
    })
}

/// `cuGraphExecDestroy`: its graph memory stays reserved (until trimmed).
///
/// # Safety
///
/// Safe with any handle: unknown ones are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: *mut c_void) -> CUresult {
    guard(|| {
        with_exec(|e| {
            let gone = e
                .execs
                .remove(&(exec as usize))
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if gone.backed {
                for (dev, bytes) in gone.allocations {
                    e.graph_memory.entry(dev).or_default().used -= bytes;
                }
            }
            Ok(())
        })
    })
}

/// `cuDeviceGraphMemTrim`: gives back the graph memory no executable uses.
///
/// # Safety
///
/// Safe with any value: invalid devices are refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: c_int) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let physical = physical()?;
        with_exec(|exec| {
            let memory = exec.graph_memory.entry(dev).or_default();
            physical.release(dev, memory.reserved - memory.used);
            memory.reserved = memory.used;
            Ok(())
        })
    })
}

/// `cuDeviceGetGraphMemAttribute`: used and reserved, current and high.
///
/// # Safety
///
/// `value` is NULL or valid for writing a `cuuint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: c_int,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let dev = device(dev)?;
        let bytes = with_exec(|exec| {
            let m = exec.graph_memory.entry(dev).or_default();
            match attr {
                0 => Ok(m.used),
                1 => Ok(m.used_high),
                2 => Ok(m.reserved),
                3 => Ok(m.reserved_high),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            }
        })?;
        // SAFETY: the caller's pointer, NULL-checked by `write`.
        unsafe { write(value.cast::<u64>(), bytes) }
    })
}
