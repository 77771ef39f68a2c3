//! One GPU's MPS control daemon: where it lives on the host and in a
//! client container, and the interface that starts and commands it.

use std::path::PathBuf;

use crate::Error;

/// The pipe directory in an MPS container (MPS's default).
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The log directory in an MPS container (MPS's default).
pub const CONTAINER_LOG_DIR: &str = "/var/log/nvidia-mps";
/// Where MPS server and clients share memory.
pub const SHM_DIR: &str = "/dev/shm";

/// One GPU's daemon: the GPU and its directories on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpsDaemon {
    /// The GPU (`CUDA_VISIBLE_DEVICES` of the daemon).
    pub uuid: String,
    /// `CUDA_MPS_PIPE_DIRECTORY` on the host.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY` on the host.
    pub log_dir: PathBuf,
    /// The `/dev/shm` the daemons and their clients share, on the host.
    pub shm_dir: PathBuf,
}

/// Starts and commands MPS control daemons.
pub trait MpsControl: Send + Sync {
    /// Starts the daemon in the background (`nvidia-cuda-mps-control -d`);
    /// its directories exist.
    fn start(&self, daemon: &MpsDaemon) -> Result<(), Error>;
    /// Sends one control command (`get_server_list`, `quit`, ...) and
    /// returns the daemon's answer.
    fn command(&self, daemon: &MpsDaemon, command: &str) -> Result<String, Error>;
}
