//! How Allocate serves a container in each sharing mode
//! ([`crate::sharing`]).

use std::sync::Arc;

use crate::{
    mig::DynamicMig,
    mps::MpsManager,
    sharing::{HamiCore, Mode, Serving},
};

/// The [`Serving`] of each mode the device plugin's Allocate serves (static
/// MIG's containers are its profile plugins').
#[derive(Clone)]
pub struct Modes {
    /// hami-core, and whole instances under `single`.
    pub hami_core: Arc<HamiCore>,
    /// Dynamic MIG.
    pub dynamic_mig: Arc<DynamicMig>,
    /// MPS.
    pub mps: Arc<MpsManager>,
}

impl Modes {
    /// How a container in `mode` is served.
    pub fn serving(&self, mode: Mode) -> Arc<dyn Serving> {
        match mode {
            Mode::DynamicMig => self.dynamic_mig.clone(),
            Mode::Mps => self.mps.clone(),
            Mode::HamiCore | Mode::MigSingle | Mode::StaticMig => self.hami_core.clone(),
        }
    }
}
