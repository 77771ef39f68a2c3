//! MIG on fake GPUs: NVIDIA's profile tables and placement rules
//! (`tessera_api::mig`), instances kept in a state file that outlives the
//! agent as a real GPU's instances do, with latency and failure injection.
//!
//! The fake GPU file turns MIG on per GPU and sets the knobs:
//!
//! ```yaml
//! mig:
//!   enabled: [GPU-a100-0]     # GPUs in MIG mode (their model needs a MIG table)
//!   createLatencyMs: 200      # how long creating an instance takes
//!   destroyLatencyMs: 100
//!   failCreate: false         # every create fails, as NVML can
//!   busy: []                  # instance UUIDs in use: destroying them fails
//!   geometry:                 # instances the operator made (static MIG):
//!     GPU-a100-0: [3g.40gb, 3g.40gb]
//! ```
//!
//! `geometry` plays nvidia-mig-parted: a GPU in MIG mode that has no
//! instances gets these, each at the first free placement its profile
//! allows, when the file is read.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tessera_api::{
    mig,
    v1alpha1::{MigInstance, MigPlacement, MigProfile},
};

use super::gpu::{PhysicalGpu, PhysicalMig};
use crate::Error;

/// The fake file's `mig` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct MigKnobs {
    /// GPUs (UUIDs) in MIG mode.
    #[serde(default)]
    pub enabled: Vec<String>,
    /// Milliseconds a create takes.
    #[serde(default)]
    pub create_latency_ms: u64,
    /// Milliseconds a destroy takes.
    #[serde(default)]
    pub destroy_latency_ms: u64,
    /// Every create fails.
    #[serde(default)]
    pub fail_create: bool,
    /// Instances in use: destroying them fails.
    #[serde(default)]
    pub busy: Vec<String>,
    /// Profiles to create on an empty GPU in MIG mode, per GPU UUID.
    #[serde(default)]
    pub geometry: BTreeMap<String, Vec<String>>,
}

/// What the state file holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    /// Creates so far: every instance gets a new UUID.
    sequence: u64,
    /// Instances per GPU UUID.
    instances: BTreeMap<String, Vec<MigInstance>>,
}

/// The fake GPUs' MIG instances.
#[derive(Debug)]
pub(super) struct FakeMig {
    state: PathBuf,
    /// One operation at a time, as NVML serialises them per GPU.
    busy: Mutex<()>,
}

impl FakeMig {
    pub(super) fn new(state: PathBuf) -> Self {
        Self {
            state,
            busy: Mutex::new(()),
        }
    }

    fn error(&self, message: String) -> Error {
        Error::Mig(format!(
            "fake MIG state {}: {message}",
            self.state.display()
        ))
    }

    fn load(&self) -> Result<State, Error> {
        match std::fs::read(&self.state) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| self.error(e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(self.error(e.to_string())),
        }
    }

    fn save(&self, state: &State) -> Result<(), Error> {
        let text = serde_json::to_vec_pretty(state).map_err(|e| self.error(e.to_string()))?;
        write_atomically(&self.state, &text).map_err(|e| self.error(e.to_string()))
    }

    /// Adds the MIG state to every GPU whose model has a MIG table.
    pub(super) fn annotate(&self, gpus: &mut [PhysicalGpu], knobs: &MigKnobs) -> Result<(), Error> {
        let state = self.load()?;
        for gpu in gpus {
            let Some(layout) = mig::layout_for_model(&gpu.model) else {
                continue;
            };
            let enabled = knobs.enabled.contains(&gpu.uuid);
            gpu.mig = Some(PhysicalMig {
                enabled,
                layout,
                instances: if enabled {
                    state.instances.get(&gpu.uuid).cloned().unwrap_or_default()
                } else {
                    Vec::new()
                },
            });
        }
        Ok(())
    }

    /// Creates `geometry`'s instances on each GPU in MIG mode that has
    /// none, as an operator would before the agent starts.
    pub(super) fn apply_geometry(
        &self,
        gpus: &[PhysicalGpu],
        knobs: &MigKnobs,
    ) -> Result<(), Error> {
        for (uuid, profiles) in &knobs.geometry {
            let Some(gpu) = gpus.iter().find(|g| g.uuid == *uuid) else {
                return Err(self.error(format!("mig.geometry: no device has uuid {uuid}")));
            };
            if !knobs.enabled.contains(uuid) || !self.instances(uuid)?.is_empty() {
                continue;
            }
            let Some(layout) = mig::layout_for_model(&gpu.model) else {
                continue;
            };
            for name in profiles {
                let profile = layout
                    .profiles
                    .iter()
                    .find(|p| p.name == *name)
                    .ok_or_else(|| {
                        self.error(format!(
                            "mig.geometry.{uuid}: no profile {name} on {}",
                            gpu.model
                        ))
                    })?;
                let taken = mig::occupied(self.instances(uuid)?.iter().map(|i| i.placement));
                let placement = mig::free_placements(profile, taken).next().ok_or_else(|| {
                    self.error(format!("mig.geometry.{uuid}: no room left for {name}"))
                })?;
                let knobs = MigKnobs {
                    create_latency_ms: 0,
                    fail_create: false,
                    ..knobs.clone()
                };
                self.create(gpu, &knobs, profile, placement)?;
            }
        }
        Ok(())
    }

    pub(super) fn instances(&self, gpu: &str) -> Result<Vec<MigInstance>, Error> {
        Ok(self.load()?.instances.remove(gpu).unwrap_or_default())
    }

    /// Creates an instance as NVML would: the GPU must be in MIG mode, the
    /// profile one of its model's, the placement allowed and free.
    pub(super) fn create(
        &self,
        physical: &PhysicalGpu,
        knobs: &MigKnobs,
        profile: &MigProfile,
        placement: MigPlacement,
    ) -> Result<MigInstance, Error> {
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::sleep(Duration::from_millis(knobs.create_latency_ms));
        let gpu = &physical.uuid;
        if !knobs.enabled.contains(gpu) {
            return Err(Error::Mig(format!("GPU {gpu}: MIG mode is disabled")));
        }
        if knobs.fail_create {
            return Err(Error::Mig(format!(
                "GPU {gpu}: creating a {} instance failed (failCreate is set in the fake GPU file)",
                profile.name
            )));
        }
        let layout = mig::layout_for_model(&physical.model)
            .ok_or_else(|| Error::Mig(format!("GPU {gpu}: {} has no MIG", physical.model)))?;
        let known = layout.profiles.iter().find(|p| p.name == profile.name);
        let Some(known) = known.filter(|p| p.id == profile.id) else {
            return Err(Error::Mig(format!(
                "GPU {gpu}: no profile {} (id {}) on {}",
                profile.name, profile.id, physical.model
            )));
        };
        if placement.size != known.memory_slices || !known.placements.contains(&placement.start) {
            return Err(Error::Mig(format!(
                "GPU {gpu}: {} may not be placed at {}:{}",
                known.name, placement.start, placement.size
            )));
        }
        let mut state = self.load()?;
        let existing = state.instances.entry(gpu.clone()).or_default();
        let occupied = mig::occupied(existing.iter().map(|i| i.placement));
        let wanted = mig::span(placement).unwrap_or(u8::MAX);
        if occupied & wanted != 0 {
            return Err(Error::Mig(format!(
                "GPU {gpu}: placement {}:{} overlaps an existing instance (NVML_ERROR_INSUFFICIENT_RESOURCES)",
                placement.start, placement.size
            )));
        }
        if existing.iter().filter(|i| i.profile == known.name).count()
            >= known.max_instances as usize
        {
            return Err(Error::Mig(format!(
                "GPU {gpu}: already {} {} instances",
                known.max_instances, known.name
            )));
        }
        state.sequence += 1;
        let instance = MigInstance {
            profile: known.name.clone(),
            uuid: mig_uuid(gpu, state.sequence),
            memory_mib: known.memory_mib,
            placement,
            held_by: None,
        };
        state
            .instances
            .entry(gpu.clone())
            .or_default()
            .push(instance.clone());
        self.save(&state)?;
        Ok(instance)
    }

    pub(super) fn destroy(&self, knobs: &MigKnobs, gpu: &str, uuid: &str) -> Result<(), Error> {
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::sleep(Duration::from_millis(knobs.destroy_latency_ms));
        if knobs.busy.iter().any(|b| b == uuid) {
            return Err(Error::Mig(format!(
                "GPU {gpu}: instance {uuid} is in use (NVML_ERROR_IN_USE)"
            )));
        }
        let mut state = self.load()?;
        let instances = state.instances.entry(gpu.to_owned()).or_default();
        let before = instances.len();
        instances.retain(|i| i.uuid != uuid);
        if instances.len() == before {
            return Err(Error::Mig(format!(
                "GPU {gpu}: no instance {uuid} (NVML_ERROR_NOT_FOUND)"
            )));
        }
        self.save(&state)
    }
}

/// A UUID in NVIDIA's MIG format, unique per GPU and create.
fn mig_uuid(gpu: &str, sequence: u64) -> String {
    // FNV-1a over the GPU and the sequence: stable, no dependency.
    let mut hash: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for byte in gpu.bytes().chain(sequence.to_le_bytes()) {
        hash ^= u128::from(byte);
        hash = hash.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    let hex = format!("{hash:032x}");
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Writes `path` through a temporary file and a rename, so a reader never
/// sees half a state.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
