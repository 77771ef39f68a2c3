//! The timeline's state in this process: created streams and what each
//! stream last enqueued or is capturing, events, graphs and executable
//! graphs, graph memory per device, and the handles they are known by.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::CUresult;

pub(crate) const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;

pub(crate) type CUstream = *mut c_void;
pub(crate) type CUevent = *mut c_void;

/// A stream's state in this process.
#[derive(Default)]
pub(crate) struct Stream {
    /// When the last work enqueued on it ends (`CLOCK_MONOTONIC` ns).
    pub(crate) last_end: u64,
    /// While captured: the graph recorded so far.
    pub(crate) capture: Option<Graph>,
}

/// Where a stream handle leads: created streams by address; the legacy and
/// per-thread default streams by (kind, thread) and device.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
pub(crate) enum StreamKey {
    Created(usize),
    Legacy(usize),
    PerThread(usize, usize),
}

#[derive(Default)]
pub(crate) struct Exec {
    /// Created streams: address → device.
    pub(crate) created: HashMap<usize, usize>,
    pub(crate) streams: HashMap<StreamKey, Stream>,
    /// Events: handle → completion time once recorded.
    pub(crate) events: HashMap<usize, Option<u64>>,
    /// Graphs and instantiated executables by handle.
    pub(crate) graphs: HashMap<usize, Graph>,
    pub(crate) execs: HashMap<usize, Executable>,
    /// Graph memory per device.
    pub(crate) graph_memory: HashMap<usize, GraphMemory>,
    /// Addresses of graph allocations (they may be freed outside a graph).
    pub(crate) graph_pointers: std::collections::HashSet<u64>,
}

#[derive(Clone, Copy)]
pub(crate) enum Node {
    Kernel,
    Alloc {
        dev: usize,
        /// As asked for.
        bytesize: u64,
        ptr: u64,
    },
    Free,
}

/// A graph: its nodes (handle, node) and the duration of its launches.
#[derive(Clone, Default)]
pub(crate) struct Graph {
    pub(crate) duration: u64,
    pub(crate) nodes: Vec<(usize, Node)>,
}

impl Graph {
    /// A captured launch of `duration` ns.
    pub(crate) fn record_kernel(&mut self, duration: u64) {
        self.duration += duration;
        self.nodes.push((new_handle(), Node::Kernel));
    }

    pub(crate) fn add(&mut self, node: Node) -> usize {
        let handle = new_handle();
        self.nodes.push((handle, node));
        handle
    }
}

/// An executable graph.
pub(crate) struct Executable {
    pub(crate) duration: u64,
    /// What backs its allocation nodes: (device, bytes in whole granules).
    pub(crate) allocations: Vec<(usize, u64)>,
    /// Backed by device memory (since its first launch).
    pub(crate) backed: bool,
}

/// A device's graph memory in this process.
#[derive(Default)]
pub(crate) struct GraphMemory {
    pub(crate) reserved: u64,
    pub(crate) used: u64,
    pub(crate) reserved_high: u64,
    pub(crate) used_high: u64,
}

static EXEC: Mutex<Option<Exec>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x5000_0000);

pub(crate) fn with_exec<T>(
    body: impl FnOnce(&mut Exec) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    let mut guard = EXEC.lock().unwrap_or_else(|e| e.into_inner());
    body(guard.get_or_insert_with(Exec::default))
}

pub(crate) fn new_handle() -> usize {
    NEXT_HANDLE.fetch_add(16, Ordering::Relaxed) as usize
}
