//! hami-core: slices of a whole GPU, which the interposer in the container
//! enforces. Also how a whole MIG instance under `migStrategy: single` is
//! served: to the interposer it is a GPU.

use tessera_api::v1alpha1::{GpuDevice, NodeSettings};

use super::mode::{Container, Offering, Serving, unhealthy};
use crate::{
    Error,
    backend::PhysicalMig,
    contract::{Contract, HostPaths, interposer_mounts, slice_env},
    holders::MigHolders,
};

/// Offers the whole GPU (hami-core and MPS): no CUDA context can use a GPU
/// in MIG mode whole, so one is offered unhealthy.
pub struct WholeGpu;

impl Offering for WholeGpu {
    fn offer(
        &self,
        whole: GpuDevice,
        mig: Option<&PhysicalMig>,
        settings: &NodeSettings,
        _: &MigHolders,
    ) -> Vec<GpuDevice> {
        if mig.is_some_and(|m| m.enabled) {
            let mode = settings.operating_mode.as_str();
            let index = whole.index;
            return unhealthy(
                whole,
                format!(
                    "MIG mode is on but the node's operatingMode is {mode}: set operatingMode: mig in a GpuNodeConfig, or turn MIG off (nvidia-smi -i {index} -mig 0)"
                ),
            );
        }
        vec![whole]
    }
}

/// Serves hami-core containers: their region and limits directories, the
/// interposer's mounts and limits.
pub struct HamiCore {
    paths: HostPaths,
}

impl HamiCore {
    /// Containers' directories go under `paths`.
    pub fn new(paths: HostPaths) -> Self {
        Self { paths }
    }
}

impl Serving for HamiCore {
    fn serve(&self, container: &Container) -> Result<Contract, Error> {
        let mut contract = contract(container, &self.paths);
        let limits = crate::install::prepare_container_dirs(
            &self.paths,
            &container.region_dir,
            &contract.envs,
        )?;
        contract.unsynced.push(limits);
        Ok(contract)
    }
}

/// What a hami-core container gets: its GPUs, the interposer's limits for
/// its slices (memory per GPU, the largest SM share) under the node's
/// settings, and the interposer's mounts. Pure.
pub fn contract(container: &Container, paths: &HostPaths) -> Contract {
    let memories: Vec<u64> = container.slices.iter().map(|s| s.memory_mib).collect();
    let cores = container.slices.iter().map(|s| s.cores).max().unwrap_or(0);
    Contract {
        visible: container.slices.iter().map(|s| s.uuid.clone()).collect(),
        envs: slice_env(&memories, cores, container.priority, &container.settings),
        mounts: interposer_mounts(paths, &container.region_dir),
        mig_instances: Vec::new(),
        unsynced: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_puts_the_limits_file_in_place_and_leaves_its_sync_to_the_door() {
        let dir = tempfile::tempdir().unwrap();
        let paths = HostPaths {
            library: dir.path().join("lib.so"),
            preload: dir.path().join("preload"),
            regions: dir.path().join("containers"),
            limits: dir.path().join("limits"),
        };
        let container = Container {
            holder: "default/pod".into(),
            name: "main".into(),
            slices: vec![tessera_api::testing::slice("GPU-a", 0, 1024, 30)],
            priority: None,
            region_dir: paths.regions.join("uid-1_main"),
            settings: NodeSettings::default(),
        };
        let contract = HamiCore::new(paths.clone()).serve(&container).unwrap();
        let file = paths.limits.join("uid-1_main/limits.env");
        assert_eq!(contract.unsynced, std::slice::from_ref(&file));
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("CUDA_DEVICE_MEMORY_LIMIT_0=1024m"), "{text}");
        crate::install::sync_in_place(&file).unwrap();
    }
}
