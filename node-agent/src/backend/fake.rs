//! Fake GPUs described by a YAML (or JSON) file, re-read on every poll so a
//! test can change health or inventory while the agent runs.
//!
//! ```yaml
//! devices:
//! - uuid: GPU-a100-0
//!   index: 0
//!   model: NVIDIA A100-SXM4-80GB
//!   memoryMiB: 81920
//!   numaNode: 0
//!   health: Healthy        # or Unhealthy
//!   healthMessage: null    # e.g. "XID 79: GPU has fallen off the bus"
//! mig:                       # optional: MIG mode and its knobs (fake_mig.rs)
//!   enabled: [GPU-a100-0]
//! ```
//!
//! MIG instances live in a state file of their own (the agent's state
//! directory), so they outlive the agent as a real GPU's do.

use std::{path::PathBuf, sync::Arc};

use serde::Deserialize;
use tessera_api::v1alpha1::{MigInstance, MigPlacement, MigProfile};

use super::{
    fake_mig::{FakeMig, MigKnobs},
    gpu::{Backend, PhysicalGpu},
};
use crate::Error;

/// Reads fake GPUs from a file.
#[derive(Clone, Debug)]
pub struct FakeBackend {
    path: PathBuf,
    mig: Arc<FakeMig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FakeFile {
    devices: Vec<PhysicalGpu>,
    #[serde(default)]
    mig: MigKnobs,
}

impl FakeBackend {
    /// A backend reading `path`, keeping MIG instances in `mig_state`.
    pub fn new(path: impl Into<PathBuf>, mig_state: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            mig: Arc::new(FakeMig::new(mig_state.into())),
        }
    }

    fn read(&self) -> Result<FakeFile, Error> {
        let error = |message: String| Error::FakeDevices {
            path: self.path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(&self.path).map_err(|e| error(e.to_string()))?;
        serde_yaml_ng::from_str(&text).map_err(|e| error(e.to_string()))
    }

    fn gpu(&self, uuid: &str) -> Result<(PhysicalGpu, MigKnobs), Error> {
        let file = self.read()?;
        let gpu = file
            .devices
            .into_iter()
            .find(|d| d.uuid == uuid)
            .ok_or_else(|| Error::Mig(format!("no GPU {uuid} on this node")))?;
        Ok((gpu, file.mig))
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn devices(&self) -> Result<Vec<PhysicalGpu>, Error> {
        let error = |message: String| Error::FakeDevices {
            path: self.path.display().to_string(),
            message,
        };
        let mut file = self.read()?;
        let mut seen = std::collections::BTreeSet::new();
        for device in &file.devices {
            if !device.uuid.starts_with("GPU-") {
                return Err(error(format!(
                    "devices[{}].uuid {:?}: must start with \"GPU-\"",
                    device.index, device.uuid
                )));
            }
            if !seen.insert(device.uuid.clone()) {
                return Err(error(format!(
                    "devices: uuid {} appears twice",
                    device.uuid
                )));
            }
            if device.memory_mib == 0 {
                return Err(error(format!(
                    "devices[{}].memoryMiB: must be greater than 0",
                    device.index
                )));
            }
        }
        for uuid in &file.mig.enabled {
            if !seen.contains(uuid) {
                return Err(error(format!("mig.enabled: no device has uuid {uuid}")));
            }
        }
        self.mig.apply_geometry(&file.devices, &file.mig)?;
        self.mig.annotate(&mut file.devices, &file.mig)?;
        for (device, uuid) in file.devices.iter().map(|d| (d, &d.uuid)) {
            if file.mig.enabled.contains(uuid) && device.mig.is_none() {
                return Err(error(format!(
                    "mig.enabled: {uuid} is a {}, which has no MIG table (A100 40GB and 80GB and H100 80GB do)",
                    device.model
                )));
            }
        }
        Ok(file.devices)
    }

    fn mig_instances(&self, gpu: &str) -> Result<Vec<MigInstance>, Error> {
        self.mig.instances(gpu)
    }

    fn create_mig(
        &self,
        gpu: &str,
        profile: &MigProfile,
        placement: MigPlacement,
    ) -> Result<MigInstance, Error> {
        let (physical, knobs) = self.gpu(gpu)?;
        self.mig.create(&physical, &knobs, profile, placement)
    }

    fn destroy_mig(&self, gpu: &str, uuid: &str) -> Result<(), Error> {
        let (_, knobs) = self.gpu(gpu)?;
        self.mig.destroy(&knobs, gpu, uuid)
    }
}

#[cfg(test)]
mod tests {
    use tessera_api::v1alpha1::DeviceHealth;

    use super::*;

    fn backend(text: &str) -> (tempfile::TempDir, FakeBackend) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.yaml");
        std::fs::write(&path, text).unwrap();
        let state = dir.path().join("mig-state.json");
        (dir, FakeBackend::new(path, state))
    }

    #[test]
    fn reads_devices_and_defaults_health() {
        let (_dir, fake) = backend(
            "devices:\n- {uuid: GPU-a, index: 0, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, numaNode: 1}\n- {uuid: GPU-b, index: 1, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, health: Unhealthy, healthMessage: XID 79}\n",
        );
        let devices = fake.devices().unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0].numa_node, Some(1));
        assert_eq!(devices[0].health, DeviceHealth::Healthy);
        assert_eq!(devices[1].health, DeviceHealth::Unhealthy);
        assert_eq!(devices[1].health_message.as_deref(), Some("XID 79"));
    }

    #[test]
    fn bad_files_name_the_file_and_the_field() {
        for (text, needle) in [
            (
                "devices:\n- {uuid: a, index: 0, model: m, memoryMiB: 1}\n",
                "must start with \"GPU-\"",
            ),
            (
                "devices:\n- {uuid: GPU-a, index: 0, model: m, memoryMiB: 0}\n",
                "memoryMiB: must be greater than 0",
            ),
            (
                "devices:\n- {uuid: GPU-a, index: 0, model: m, memoryMiB: 1}\n- {uuid: GPU-a, index: 1, model: m, memoryMiB: 1}\n",
                "appears twice",
            ),
            (
                "devices:\n- {uuid: GPU-a, index: 0, model: m, memoryMiB: 1, colour: red}\n",
                "colour",
            ),
            ("gpus: []\n", "devices"),
        ] {
            let (_dir, fake) = backend(text);
            let error = fake.devices().unwrap_err().to_string();
            assert!(
                error.contains("gpus.yaml") && error.contains(needle),
                "{text}: {error}"
            );
        }
    }
}
