//! `tessera-node-agent mps-daemons`: the MPS host ([`crate::mps::host`]),
//! its flags and its run until stopped.

use std::{path::PathBuf, sync::Arc};

use clap::Parser;

use super::{args::BackendKind, signal};
use crate::{
    Error,
    mps::{FakeControl, MpsControl, MpsManager, NvidiaControl, shm},
};

/// The subcommand that runs the MPS host instead of the agent.
pub const SUBCOMMAND: &str = "mps-daemons";

/// Runs the node's MPS control daemons, one per GPU the node agent offers
/// in `operatingMode: mps`, apart from the agent so that they outlive it.
#[derive(Parser, Debug, Clone)]
#[command(name = "tessera-node-agent mps-daemons", version, about)]
pub struct MpsArgs {
    /// `nvml`: NVIDIA's control daemons (`--mps-control`); `fake`: a fake
    /// daemon in this process answering the same commands (no GPUs).
    #[arg(long, env = "TESSERA_GPU_BACKEND", value_enum, default_value = "nvml")]
    pub backend: BackendKind,
    /// The agent's state directory: the daemons live under `<dir>/mps`, and
    /// the agent hands over its GPUs in MPS mode in `<dir>/mps/daemons`.
    #[arg(long, env = "TESSERA_STATE_DIR", default_value = "/var/lib/tessera")]
    pub state_dir: PathBuf,
    /// NVIDIA's MPS control program, run once per GPU in MPS mode.
    #[arg(
        long,
        env = "TESSERA_MPS_CONTROL",
        default_value = "nvidia-cuda-mps-control"
    )]
    pub mps_control: PathBuf,
    /// The size of the tmpfs MPS daemons and clients share as `/dev/shm`
    /// (`<state-dir>/mps/shm`), in MiB (1 to 1048576): a tenant that fills
    /// it gets ENOSPC. The host starts no daemon while it is another size.
    #[arg(long, env = "TESSERA_MPS_SHM_SIZE_MIB", default_value_t = 1024)]
    pub shm_size_mib: u64,
    /// Mount (or resize) that tmpfs and exit: the chart's init container,
    /// which runs with the state directory mounted Bidirectional so that
    /// the node and the clients' containers see the mount.
    #[arg(long)]
    pub mount_shm: bool,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "TESSERA_LOG", default_value = "info")]
    pub log: String,
}

impl MpsArgs {
    /// The flags after the subcommand's name, when the first argument of
    /// `args` (after the program) is [`SUBCOMMAND`]; `None` otherwise.
    pub fn from_command_line(args: &[std::ffi::OsString]) -> Option<Self> {
        let (program, rest) = args.split_first()?;
        let (first, flags) = rest.split_first()?;
        (first == SUBCOMMAND).then(|| Self::parse_from(std::iter::once(program).chain(flags)))
    }
}

/// How a daemon is driven under `backend`: NVIDIA's program, or the fake
/// daemon (the agent uses the same to ask a daemon whether it answers).
pub(super) fn control(backend: BackendKind, program: &std::path::Path) -> Arc<dyn MpsControl> {
    match backend {
        BackendKind::Nvml => Arc::new(NvidiaControl::new(program)),
        BackendKind::Fake => Arc::new(FakeControl),
    }
}

/// Runs the MPS host until the process is stopped (SIGTERM or SIGINT).
/// With `--mount-shm`, mounts the clients' `/dev/shm` and returns.
/// Otherwise first checks that mount: no daemon serves clients whose
/// shared memory is unbounded.
pub async fn run_mps_host(args: MpsArgs) -> Result<(), Error> {
    let root = args.state_dir.join("mps");
    let shm = root.join("shm");
    if args.mount_shm {
        return shm::mount_tmpfs(&shm, args.shm_size_mib);
    }
    shm::check(&shm, args.shm_size_mib)?;
    let manager = Arc::new(MpsManager::new(
        control(args.backend, &args.mps_control),
        root.clone(),
    ));
    tokio::select! {
        () = crate::mps::host::run(manager, root) => Err(Error::LoopEnded { name: "MPS host", how: "returned".into() }),
        () = signal::stop() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    #[test]
    fn the_subcommand_takes_its_own_flags_and_the_agent_keeps_its_own() {
        let host = MpsArgs::from_command_line(&line(&[
            "tessera-node-agent",
            "mps-daemons",
            "--backend=fake",
            "--state-dir=/srv/tessera",
        ]))
        .unwrap();
        assert_eq!(host.backend, BackendKind::Fake);
        assert_eq!(host.state_dir, PathBuf::from("/srv/tessera"));
        assert_eq!(host.shm_size_mib, 1024);
        assert!(!host.mount_shm);
        assert!(
            MpsArgs::from_command_line(&line(&["tessera-node-agent", "--node-name", "n1"]))
                .is_none()
        );
        assert!(MpsArgs::from_command_line(&line(&["tessera-node-agent"])).is_none());
        let bad = MpsArgs::try_parse_from(["mps-daemons", "--backend", "rocm"]).unwrap_err();
        assert!(bad.to_string().contains("--backend"), "{bad}");
    }
}
