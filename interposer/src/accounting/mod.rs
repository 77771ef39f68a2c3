//! The accounting layer: pure bookkeeping in the container's shared region
//! (`tessera_vgpu_region`). Reservations before an allocation, the
//! allocations they became, stores that keep bytes after their allocations
//! are freed, this process's slot, and the pids the driver reports. It
//! never calls the driver (what a store holds comes in as a function), so
//! it is unit-tested against a region file alone.

pub(crate) mod enforcer;
pub(crate) mod keys;
pub(crate) mod pids;
pub(crate) mod reclaim;
pub(crate) mod slot;
pub(crate) mod stores;
