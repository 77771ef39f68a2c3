//! Tessera's control plane.
//!
//! - [`engine`]: pure placement logic (fit, device choice, scores, reasons).
//! - [`projection`]: GpuNodes and VgpuAllocations folded into a per-node ledger.
pub mod engine;
pub mod projection;
