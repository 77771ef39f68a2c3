//! The NVML backend's MIG path (`tessera-nvml-mig`'s raw NVML calls) against
//! the fake NVML (`interposer/fake-nvml`, an A100-80GB in MIG mode): the
//! layout read from NVML is Tessera's table for the board, and instances are
//! created at a placement, listed with their MIG UUIDs, refused where NVML
//! refuses them, and destroyed, also through the MIG manager as Allocate
//! drives it.
//!
//! The fake reads `FAKE_NVML_MIG` from the environment, which a test may not
//! set in its own process: the test runs itself again as a child with it set.

use std::{collections::HashMap, process::Command, sync::Arc};

use tessera_api::{
    mig,
    v1alpha1::{MigPlacement, MigSlice, NodeSettings, OperatingMode},
};
use tessera_node_agent::{
    backend::{Backend, NvmlBackend},
    holders::MigHolders,
    mig::MigManager,
    settings::offered,
};

const TEST: &str = "the_nvml_backend_reads_creates_and_destroys_mig_instances";

#[test]
fn the_nvml_backend_reads_creates_and_destroys_mig_instances() {
    if std::env::var_os("FAKE_NVML_MIG").is_none() {
        let status = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env("FAKE_NVML_MIG", "1")
            .status()
            .unwrap();
        assert!(status.success(), "the test in its child failed");
        return;
    }
    let library = support::cdylib("libnvidia_ml.so");
    let backend = NvmlBackend::with_library(Some(library.into_os_string())).unwrap();

    // The layout NVML reports is Tessera's table for the board.
    let gpus = backend.devices().unwrap();
    assert_eq!(gpus.len(), 1);
    let gpu = &gpus[0];
    assert_eq!(gpu.model, "NVIDIA A100-SXM4-80GB");
    let found = gpu.mig.as_ref().expect("a MIG-capable GPU");
    assert!(found.enabled);
    assert!(found.instances.is_empty());
    let mut read = found.layout.clone();
    let mut table = mig::layout_for_model(&gpu.model).unwrap();
    for layout in [&mut read, &mut table] {
        layout.profiles.sort_by(|a, b| a.name.cmp(&b.name));
    }
    assert_eq!(read, table);

    // Create, list, refuse, destroy.
    let profile = |name: &str| {
        read.profiles
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .clone()
    };
    let made = backend
        .create_mig(
            &gpu.uuid,
            &profile("3g.40gb"),
            MigPlacement { start: 4, size: 4 },
        )
        .unwrap();
    assert!(made.uuid.starts_with("MIG-"), "{made:?}");
    assert_eq!(made.placement, MigPlacement { start: 4, size: 4 });
    assert_eq!(made.memory_mib, 40192);
    assert_eq!(
        backend.mig_instances(&gpu.uuid).unwrap(),
        vec![made.clone()]
    );
    let overlap = backend
        .create_mig(
            &gpu.uuid,
            &profile("1g.10gb"),
            MigPlacement { start: 5, size: 1 },
        )
        .unwrap_err()
        .to_string();
    assert!(
        overlap.contains("nvmlDeviceCreateGpuInstanceWithPlacement"),
        "{overlap}"
    );
    let misplaced = backend
        .create_mig(
            &gpu.uuid,
            &profile("3g.40gb"),
            MigPlacement { start: 2, size: 4 },
        )
        .unwrap_err()
        .to_string();
    assert!(misplaced.contains(&gpu.uuid), "{misplaced}");
    backend.destroy_mig(&gpu.uuid, &made.uuid).unwrap();
    assert!(backend.mig_instances(&gpu.uuid).unwrap().is_empty());
    let gone = backend
        .destroy_mig(&gpu.uuid, &made.uuid)
        .unwrap_err()
        .to_string();
    assert!(gone.contains("no MIG instance"), "{gone}");

    // The MIG manager over NVML, as Allocate drives it: the scheduler's
    // choice becomes an instance, and a retried Allocate reuses it.
    let backend = Arc::new(backend);
    let settings = NodeSettings {
        operating_mode: OperatingMode::Mig,
        ..NodeSettings::default()
    };
    let devices = offered(&backend.devices().unwrap(), &settings, &MigHolders::new());
    assert_eq!(devices[0].health_message, None);
    let layouts: HashMap<_, _> = devices
        .iter()
        .map(|d| (d.uuid.clone(), d.mig.clone().unwrap()))
        .collect();
    let choice = MigSlice {
        profile: "1g.10gb".into(),
        placement: MigPlacement { start: 6, size: 1 },
    };
    let slices = vec![(gpu.uuid.clone(), choice)];
    let manager = MigManager::new(backend.clone());
    let first = manager
        .ensure("ml/a", &slices, &layouts, &MigHolders::new())
        .unwrap();
    let again = manager
        .ensure("ml/a", &slices, &layouts, &MigHolders::new())
        .unwrap();
    assert_eq!(first, again, "a retried Allocate reuses the instance");
    assert_eq!(backend.mig_instances(&gpu.uuid).unwrap().len(), 1);
}
