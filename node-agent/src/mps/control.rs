//! NVIDIA's MPS control daemon, driven through its own client:
//! `nvidia-cuda-mps-control -d` starts it, and each command is a line on
//! the client's stdin, answered on its stdout.

use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{MpsControl, MpsDaemon};
use crate::Error;

/// How long one control command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// `nvidia-cuda-mps-control` (or another program that speaks its
/// command line).
#[derive(Clone, Debug)]
pub struct NvidiaControl {
    program: PathBuf,
}

impl NvidiaControl {
    /// Runs `program` (e.g. `nvidia-cuda-mps-control`, found on `PATH`).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
        }
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
