//! NVIDIA's MPS control daemon, driven through its own client:
//! `nvidia-cuda-mps-control -d` starts it, and each command is a line on
//! the client's stdin, answered on its stdout.

use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::daemon::{MpsControl, MpsDaemon, SHM_DIR};
use crate::Error;

/// How long one control command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// `nvidia-cuda-mps-control` (or another program that speaks its
/// command line).
#[derive(Clone, Debug)]
pub struct NvidiaControl {
    program: PathBuf,
    /// The `/dev/shm` the daemon sees (the agent's own).
    shm: PathBuf,
}

impl NvidiaControl {
    /// Runs `program` (e.g. `nvidia-cuda-mps-control`, found on `PATH`).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            shm: PathBuf::from(SHM_DIR),
        }
    }

    /// The daemon's `/dev/shm` is `shm` instead of the agent's (tests).
    pub fn with_shm(mut self, shm: impl Into<PathBuf>) -> Self {
        self.shm = shm.into();
        self
    }

    fn command_for(&self, daemon: &MpsDaemon) -> Command {
        let mut command = Command::new(&self.program);
        command
            .env("CUDA_VISIBLE_DEVICES", &daemon.uuid)
            .env("CUDA_MPS_PIPE_DIRECTORY", &daemon.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &daemon.log_dir);
        command
    }

    fn failed(&self, daemon: &MpsDaemon, what: &str, detail: impl std::fmt::Display) -> Error {
        Error::Mps(format!(
            "{} ({what}, GPU {}): {detail}",
            self.program.display(),
            daemon.uuid
        ))
    }
}

impl MpsControl for NvidiaControl {
    fn start(&self, daemon: &MpsDaemon) -> Result<(), Error> {
        // The daemon runs here, with this process's /dev/shm: its clients
        // get `shm_dir` as theirs, so the two must be one directory.
        if !same_dir(&self.shm, &daemon.shm_dir) {
            return Err(self.failed(
                daemon,
                "starting",
                format!(
                    "the agent's {} is not {}, which MPS containers get as theirs: the daemon and its clients would not share memory (the chart mounts it; without the chart, mount it at the agent's {})",
                    self.shm.display(),
                    daemon.shm_dir.display(),
                    SHM_DIR
                ),
            ));
        }
        let output = self
            .command_for(daemon)
            .arg("-d")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| self.failed(daemon, "starting", e))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(self.failed(daemon, "starting", format!("{}: {stderr}", output.status)));
        }
        Ok(())
    }

    fn command(&self, daemon: &MpsDaemon, line: &str) -> Result<String, Error> {
        let mut child = self
            .command_for(daemon)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.failed(daemon, line, e))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A client that finds no daemon exits without reading: its
            // exit status and stderr then say why.
            match stdin.write_all(format!("{line}\n").as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(self.failed(daemon, line, e));
                }
                _ => {}
            }
        }
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while child
            .try_wait()
            .map_err(|e| self.failed(daemon, line, e))?
            .is_none()
        {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(self.failed(daemon, line, "no answer in 10 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child
            .wait_with_output()
            .map_err(|e| self.failed(daemon, line, e))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(self.failed(daemon, line, format!("{}: {stderr}", output.status)));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// Whether `a` and `b` are the same directory (one inode, however mounted).
fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.is_dir() && a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
