//! A private mount namespace per real node. The kubelet's device-plugin
//! directory is fixed (`/var/lib/kubelet/device-plugins`), so each node's
//! kubelet and containerd run in a namespace where that path is the node's
//! own directory. Mounts made inside (overlays, pod network namespaces) go
//! away with the namespace.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::process::{Lifetime, Process};

/// The process holding a node's mount namespace open.
#[derive(Debug)]
pub(crate) struct MountNamespace {
    pub(crate) holder: Process,
}

impl MountNamespace {
    /// Creates the namespace (every mount private to it) and waits until it
    /// exists.
    pub(crate) fn create(log: PathBuf, lifetime: Lifetime) -> Result<Self, Error> {
        let args = [
            "--mount",
            "--propagation",
            "private",
            "--",
            "sleep",
            "infinity",
        ]
        .map(str::to_owned);
        let holder = Process::spawn("sleep", Path::new("unshare"), &args, log, lifetime)?;
        let own = std::fs::read_link("/proc/self/ns/mnt").ok();
        let deadline = Instant::now() + Duration::from_secs(10);
        // `unshare` forks and execs: until the namespace exists, nsenter
        // would join the host's.
        while std::fs::read_link(format!("/proc/{}/ns/mnt", holder.pid())).ok() == own {
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "the node's mount namespace".into(),
                    seconds: 10,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Self { holder })
    }

    /// Arguments that run a program inside: `nsenter -t <pid> -m -- …`.
    pub(crate) fn enter_args(&self, program: &Path, args: &[String]) -> Vec<String> {
        let mut all = vec![
            "-t".to_owned(),
            self.holder.pid().to_string(),
            "-m".to_owned(),
            "--".to_owned(),
            program.display().to_string(),
        ];
        all.extend_from_slice(args);
        all
    }

    /// Bind-mounts `source` on `target` inside the namespace.
    pub(crate) fn bind(&self, source: &Path, target: &Path) -> Result<(), Error> {
        std::fs::create_dir_all(target).map_err(Error::io("create directory", target))?;
        let args = self.enter_args(
            Path::new("mount"),
            &[
                "--bind".to_owned(),
                source.display().to_string(),
                target.display().to_string(),
            ],
        );
        let output = Command::new("nsenter")
            .args(&args)
            .output()
            .map_err(Error::io("run nsenter", target))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "bind mount of {} on {} failed: {}",
                source.display(),
                target.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }
}
