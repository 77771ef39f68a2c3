//! Tessera's control plane.
//!
//! - [`engine`]: pure placement logic (fit, device choice, scores, reasons).
pub mod engine;
