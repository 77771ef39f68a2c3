//! The container contract: what a container gets from the agent, whichever
//! door serves it. A sharing mode ([`crate::sharing`]) decides it as a
//! [`Contract`]; each door serialises that unchanged: the device plugin
//! into its Allocate answer (the devices through the node's device-list
//! strategy), DRA into a CDI device's container edits. Nothing else adds to
//! or takes from what a container gets.
//!
//! The pieces of hami-core's contract live here too: the interposer's
//! library and preload list, the container's region and limits directories,
//! and the limit variables.

use std::{collections::BTreeMap, path::PathBuf};

use tessera_api::{
    env,
    v1alpha1::{CorePolicy, NodeSettings, ServedMigInstance},
};

/// What one container gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contract {
    /// The devices it sees (GPU or MIG instance UUIDs), in its CUDA order;
    /// the door passes them on (`NVIDIA_VISIBLE_DEVICES`, CDI names).
    pub visible: Vec<String>,
    /// Its environment, besides how the devices are passed.
    pub envs: BTreeMap<String, String>,
    /// Its bind mounts.
    pub mounts: Vec<MountSpec>,
    /// The MIG instances made for it (dynamic MIG), which the ledger records.
    pub mig_instances: Vec<ServedMigInstance>,
    /// Files written for it that are in place but not yet on disk (the
    /// limits file): the door syncs them ([`crate::install::sync_in_place`])
    /// before it records the container as served.
    pub unsynced: Vec<PathBuf>,
}

/// Where the interposer lives in a container.
pub const CONTAINER_LIBRARY: &str = "/usr/local/vgpu/libtessera_vgpu.so";
/// The preload list the agent mounts into containers.
pub const CONTAINER_PRELOAD: &str = "/etc/ld.so.preload";
/// Where a container's shared accounting region directory is mounted.
pub const CONTAINER_REGION_DIR: &str = "/var/run/tessera/vgpu";
/// The region file inside [`CONTAINER_REGION_DIR`].
pub const REGION_FILE: &str = "region";

/// Host paths the agent hands to containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPaths {
    /// The interposer library on the host.
    pub library: PathBuf,
    /// The preload list on the host (one line: [`CONTAINER_LIBRARY`]).
    pub preload: PathBuf,
    /// The directory under which each container gets its region directory.
    pub regions: PathBuf,
    /// The directory under which each container gets its limits directory
    /// (named as its region directory), mounted read-only at
    /// [`env::LIMITS_DIR`].
    pub limits: PathBuf,
}

impl HostPaths {
    /// The limits directory of the container whose region directory is
    /// `region_dir`: the same name under [`HostPaths::limits`]. (A region
    /// directory is always `<owner>_<container>` under the regions root, so
    /// it has a name; `_` only keeps this total.)
    pub fn limits_dir(&self, region_dir: &std::path::Path) -> PathBuf {
        match region_dir.file_name() {
            Some(name) => self.limits.join(name),
            None => self.limits.join("_"),
        }
    }
}

/// A bind mount for the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountSpec {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The interposer's environment for a container holding slices of
/// `memories` MiB (in its CUDA device order) and `cores` percent of the SMs
/// (0: no limit), under the node's `settings`: the limits, the region, the
/// policy, the priority and the log level (the devices themselves come from
/// the [`DeviceList`]).
pub fn slice_env(
    memories: &[u64],
    cores: u32,
    priority: Option<u32>,
    settings: &NodeSettings,
) -> BTreeMap<String, String> {
    let mut envs = BTreeMap::new();
    for (i, memory_mib) in memories.iter().enumerate() {
        envs.insert(
            env::memory_limit_var(i),
            env::format_memory_limit(*memory_mib),
        );
    }
    envs.insert(env::CUDA_DEVICE_SM_LIMIT.to_owned(), cores.to_string());
    if let Some(priority) = priority {
        envs.insert(env::CUDA_TASK_PRIORITY.to_owned(), priority.to_string());
    }
    envs.insert(
        env::CUDA_DEVICE_MEMORY_SHARED_CACHE.to_owned(),
        format!("{CONTAINER_REGION_DIR}/{REGION_FILE}"),
    );
    let policy = match settings.gpu_core_policy {
        CorePolicy::Default => "default",
        CorePolicy::Force => "force",
        CorePolicy::Disable => "disable",
    };
    envs.insert(
        env::GPU_CORE_UTILIZATION_POLICY.to_owned(),
        policy.to_owned(),
    );
    envs.insert(
        env::LIBCUDA_LOG_LEVEL.to_owned(),
        settings.lib_cuda_log_level.to_string(),
    );
    if settings.device_memory_scaling > 1.0 {
        envs.insert(env::CUDA_OVERSUBSCRIBE.to_owned(), "true".to_owned());
    }
    envs
}

/// The interposer's mounts: the library, the preload list and the
/// container's limits directory read-only, and its region directory
/// `region_dir` read-write.
pub fn interposer_mounts(paths: &HostPaths, region_dir: &std::path::Path) -> Vec<MountSpec> {
    vec![
        MountSpec {
            container_path: CONTAINER_LIBRARY.to_owned(),
            host_path: paths.library.clone(),
            read_only: true,
        },
        MountSpec {
            container_path: CONTAINER_PRELOAD.to_owned(),
            host_path: paths.preload.clone(),
            read_only: true,
        },
        MountSpec {
            container_path: CONTAINER_REGION_DIR.to_owned(),
            host_path: region_dir.to_owned(),
            read_only: false,
        },
        MountSpec {
            container_path: env::LIMITS_DIR.to_owned(),
            host_path: paths.limits_dir(region_dir),
            read_only: true,
        },
    ]
}
