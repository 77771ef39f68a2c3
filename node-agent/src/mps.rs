//! MPS on the node: one MPS control daemon per GPU the node offers in
//! `operatingMode: mps`, and what Allocate gives an MPS container.
//!
//! The daemons run in a process of their own, the MPS host
//! (`tessera-node-agent mps-daemons`, the chart's `<release>-mps`
//! DaemonSet), as NVIDIA runs its MPS control daemon beside its device
//! plugin: an agent that restarts or is upgraded leaves every running MPS
//! client served. The agent hands the host the GPUs it offers in MPS mode
//! ([`handoff`]: one file in its state directory) and, in Allocate, gives a
//! container its GPU's daemon once that daemon answers ([`MpsManager::answering`]);
//! the host starts the daemons, restarts one that died and quits those of
//! GPUs that left MPS mode ([`host`]).
//!
//! Each GPU's daemon has its own pipe and log directories under the agent's
//! state directory (`mps/<uuid>/pipe`, `mps/<uuid>/log`); a container on the
//! GPU gets both, mounted read-only (a client connects to the daemon's
//! sockets, which a read-only mount allows), so no tenant can plant a file
//! where the daemon, which runs as root, writes. MPS server and clients also
//! share memory through `/dev/shm`: every daemon and every MPS container see
//! one shared tmpfs of a fixed size there (`mps/shm`, [`shm`]; the chart
//! mounts it at the MPS host's `/dev/shm`, and Allocate at the
//! container's), as NVIDIA's device plugin arranges it. The container's share is the client's own settings:
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from `gpucores` and
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` from the memory slice, which the MPS
//! server enforces; the interposer stays out (see docs/modes.md).
//!
//! [`MpsControl`] is how a daemon is driven: NVIDIA's
//! `nvidia-cuda-mps-control` ([`NvidiaControl`]) or, with the fake backend,
//! [`FakeControl`], a daemon in the MPS host that answers the same control
//! commands on a socket in the pipe directory.

mod control;
mod daemon;
mod fake;
pub mod handoff;
pub mod host;
pub mod shm;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use tessera_api::{env, v1alpha1::DeviceHealth};

pub use control::NvidiaControl;
pub use daemon::{CONTAINER_LOG_DIR, CONTAINER_PIPE_DIR, MpsControl, MpsDaemon, SHM_DIR};
pub use fake::FakeControl;

use crate::{
    Error,
    contract::{Contract, MountSpec},
    offer::Offer,
    sharing::mode::{Container, Mode, Serving},
};

/// How often the host checks the daemons (and starts those missing).
pub const PASS: Duration = Duration::from_secs(2);
/// How long Allocate waits for a GPU's daemon to answer: a GPU just put
/// in MPS mode gets its daemon on the host's next pass.
pub const ANSWER_WAIT: Duration = Duration::from_secs(6);

/// One daemon per GPU in MPS mode: started and kept by the MPS host
/// ([`MpsManager::ensure`], [`MpsManager::reconcile`]), looked up by the
/// agent ([`MpsManager::answering`]).
pub struct MpsManager {
    control: Arc<dyn MpsControl>,
    root: PathBuf,
    /// The GPUs whose daemon this agent started or found.
    running: Mutex<BTreeSet<String>>,
}

impl MpsManager {
    /// A manager whose daemons' directories live under `root`.
    pub fn new(control: Arc<dyn MpsControl>, root: impl Into<PathBuf>) -> Self {
        Self {
            control,
            root: root.into(),
            running: Mutex::default(),
        }
    }

    /// The daemon of GPU `uuid`. The UUID names a directory, so one that is
    /// not a single path component is refused.
    pub fn daemon(&self, uuid: &str) -> Result<MpsDaemon, Error> {
        if uuid.is_empty() || uuid.contains(['/', '\0']) || uuid == "." || uuid == ".." {
            return Err(Error::Mps(format!(
                "GPU UUID {uuid:?} cannot name a directory under {}",
                self.root.display()
            )));
        }
        let dir = self.root.join(uuid);
        Ok(MpsDaemon {
            uuid: uuid.to_owned(),
            pipe_dir: dir.join("pipe"),
            log_dir: dir.join("log"),
            shm_dir: self.root.join("shm"),
        })
    }

    /// The GPU's daemon, started unless it answers already.
    pub fn ensure(&self, uuid: &str) -> Result<MpsDaemon, Error> {
        let daemon = self.daemon(uuid)?;
        if self.control.command(&daemon, "get_server_list").is_err() {
            for dir in [&daemon.pipe_dir, &daemon.log_dir] {
                create_dir(dir, 0o755)?;
            }
            // Clients create their segments here, as in any /dev/shm.
            create_dir(&daemon.shm_dir, 0o1777)?;
            self.control.start(&daemon)?;
            answers_within(self.control.as_ref(), &daemon, START_WAIT).map_err(|error| {
                Error::Mps(format!(
                    "the MPS control daemon of {uuid} does not answer {} s after starting: {error}",
                    START_WAIT.as_secs()
                ))
            })?;
            tracing::info!(gpu = %uuid, pipe = %daemon.pipe_dir.display(), "MPS control daemon started");
        }
        self.lock().insert(uuid.to_owned());
        Ok(daemon)
    }

    /// The GPU's daemon once it answers, waiting up to `wait` for the MPS
    /// host to start it; the agent never starts one itself.
    pub fn answering(&self, uuid: &str, wait: Duration) -> Result<MpsDaemon, Error> {
        let daemon = self.daemon(uuid)?;
        answers_within(self.control.as_ref(), &daemon, wait).map_err(|error| {
            Error::Mps(format!(
                "the MPS control daemon of GPU {uuid} does not answer after {} s (the MPS host, `tessera-node-agent mps-daemons`, runs it; is its pod running on this node?): {error}",
                wait.as_secs()
            ))
        })?;
        Ok(daemon)
    }

    /// One pass: a daemon for every GPU in `wanted`; `quit` for the
    /// daemons of GPUs no longer wanted. Returns the GPUs whose daemon
    /// failed, with why.
    pub fn reconcile(&self, wanted: &BTreeSet<String>) -> BTreeMap<String, String> {
        let mut failed = BTreeMap::new();
        for uuid in wanted {
            if let Err(error) = self.ensure(uuid) {
                failed.insert(uuid.clone(), error.to_string());
            }
        }
        let gone: Vec<String> = self.lock().difference(wanted).cloned().collect();
        for uuid in gone {
            let stopped = self
                .daemon(&uuid)
                .and_then(|d| self.control.command(&d, "quit"));
            match stopped {
                Ok(_) => {
                    tracing::info!(gpu = %uuid, "MPS control daemon stopped: the GPU left MPS mode");
                    self.lock().remove(&uuid);
                }
                Err(error) => {
                    failed.insert(uuid, error.to_string());
                }
            }
        }
        failed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Creates `dir` (and its parents) with `mode`: 0755 for the daemon's
/// directories, which containers get read-only; 1777 for the shared
/// `/dev/shm`. A symlink in its place is refused.
fn create_dir(dir: &Path, mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let meta =
        std::fs::symlink_metadata(dir).map_err(Error::io(format!("reading {}", dir.display())))?;
    if !meta.is_dir() {
        return Err(Error::Mps(format!(
            "{} is not a directory (a symlink?)",
            dir.display()
        )));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(Error::io(format!("setting the mode of {}", dir.display())))
}

/// How long a daemon just started may take to open its pipes.
const START_WAIT: Duration = Duration::from_secs(5);

/// Asks the daemon `get_server_list` every 100 ms until it answers, for at
/// most `wait` (at least once); the last error otherwise.
fn answers_within(
    control: &dyn MpsControl,
    daemon: &MpsDaemon,
    wait: Duration,
) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match control.command(daemon, "get_server_list") {
            Ok(_) => return Ok(()),
            Err(error) if std::time::Instant::now() >= deadline => return Err(error),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The GPUs that get a daemon: on an MPS node, the healthy ones it offers.
pub fn wanted(offer: &Offer) -> BTreeSet<String> {
    if !Mode::of(&offer.resolved.settings).needs_mps_daemons() {
        return BTreeSet::new();
    }
    offer
        .devices
        .iter()
        .filter(|d| d.health == DeviceHealth::Healthy)
        .map(|d| d.uuid.clone())
        .collect()
}

/// The agent's side of the hand-off: writes the GPUs it offers in MPS mode
/// for the MPS host ([`handoff`]) whenever its offer changes.
pub async fn hand_off(root: PathBuf, mut offers: tokio::sync::watch::Receiver<Offer>) {
    loop {
        let gpus = wanted(&offers.borrow_and_update());
        let dir = root.clone();
        match tokio::task::spawn_blocking(move || handoff::write(&dir, &gpus)).await {
            Ok(Ok(true)) => {
                tracing::info!(file = %handoff::path(&root).display(), "GPUs in MPS mode handed to the MPS host")
            }
            Ok(Ok(false)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "handing the GPUs in MPS mode to the MPS host")
            }
            Err(error) => tracing::warn!(%error, "the MPS hand-off task stopped"),
        }
        if offers.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Serves MPS containers ([`crate::sharing`]): the GPU, once its daemon
/// answers, with the client's share of it; no interposer.
impl Serving for MpsManager {
    fn serve(&self, container: &Container) -> Result<Contract, Error> {
        let [slice] = container.slices.as_slice() else {
            return Err(Error::Mps(format!(
                "pod {} container {}: an MPS container has one GPU (one daemon each), this one has {}",
                container.holder,
                container.name,
                container.slices.len()
            )));
        };
        let daemon = self.answering(&slice.uuid, ANSWER_WAIT)?;
        let (envs, mounts) = client_share(&daemon, slice.memory_mib, slice.cores);
        Ok(Contract {
            visible: vec![slice.uuid.clone()],
            envs,
            mounts,
            ..Contract::default()
        })
    }
}

/// A client's part of an MPS GPU: the daemon's directories read-only, the
/// shared `/dev/shm`, and its share of the GPU (`memory_mib` pinned,
/// `cores` percent of the SMs; 0 or 100: all) as MPS client settings.
pub fn client_share(
    daemon: &MpsDaemon,
    memory_mib: u64,
    cores: u32,
) -> (BTreeMap<String, String>, Vec<MountSpec>) {
    let mut envs = BTreeMap::new();
    let mut set = |name: &str, value: String| envs.insert(name.to_owned(), value);
    set(env::CUDA_MPS_PIPE_DIRECTORY, CONTAINER_PIPE_DIR.to_owned());
    set(env::CUDA_MPS_LOG_DIRECTORY, CONTAINER_LOG_DIR.to_owned());
    set(
        env::CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
        format!("0={memory_mib}M"),
    );
    if (1..100).contains(&cores) {
        set(env::CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, cores.to_string());
    }
    let mounts = vec![
        MountSpec {
            container_path: CONTAINER_PIPE_DIR.to_owned(),
            host_path: daemon.pipe_dir.clone(),
            read_only: true,
        },
        MountSpec {
            container_path: CONTAINER_LOG_DIR.to_owned(),
            host_path: daemon.log_dir.clone(),
            read_only: true,
        },
        MountSpec {
            container_path: SHM_DIR.to_owned(),
            host_path: daemon.shm_dir.clone(),
            read_only: false,
        },
    ];
    (envs, mounts)
}

#[cfg(test)]
mod tests;
