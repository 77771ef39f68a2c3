//! Tessera's custom resources, group `tessera.dev`, version `v1alpha1`.
//!
//! ```text
//!   GpuNodeConfig ──selects──▶ Node ◀──owner── GpuNode        (agent: inventory)
//!                                ▲
//!   Pod ◀──owner── VgpuAllocation│ (scheduler: the decision; agent: served)
//!    ▲                           │
//!    └──── holder ─── NodeLock ──┘ (scheduler → agent: who Allocate serves next)
//! ```
//!
//! Facts live in these objects; every in-memory view is rebuilt from them.

// Each `#[kube(printcolumn(name = .., type_ = ..))]` repeats the same keys by
// design; clippy reads the repetition as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

mod common;
mod gpu_node;
mod gpu_node_config;
mod mig;
mod node_lock;
mod vgpu_allocation;

pub use common::{
    AppClass, CorePolicy, DeviceFamily, DeviceHealth, FrontDoor, MigStrategy, OperatingMode,
    QosPolicy, SchedulingPolicy, Sharing,
};
pub use gpu_node::{
    CapacitySummary, DeviceCapacity, DeviceProfile, GpuDevice, GpuNode, GpuNodeSpec, GpuNodeStatus,
    NodeSettings, PlacementScore,
};
pub use gpu_node_config::{
    ConfigConflict, FilterDevices, GpuNodeConfig, GpuNodeConfigSpec, GpuNodeConfigStatus,
    TuningAdvice, TuningStatus, TuningWait,
};
pub use mig::{MigInstance, MigLayout, MigPlacement, MigProfile, MigSlice, ServedMigInstance};
pub use node_lock::{MAX_LOCK_TTL_SECONDS, NodeLock, NodeLockSpec, PodReference};
pub use vgpu_allocation::{
    AllocationPhase, AllocationTotals, ClaimReference, ContainerAllocation, DeviceSlice,
    Nomination, TraceContext, VgpuAllocation, VgpuAllocationSpec, VgpuAllocationStatus,
};
