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
        self.mount(target, &["--bind", &source.display().to_string()])
    }

    /// Makes `path` a mount point of its own with shared propagation, as
    /// the kubelet wants its root directory. On a real node `/` is shared
    /// (systemd), so the kubelet finds its root shared and leaves it be;
    /// in this private namespace it would bind the root on itself while
    /// its pod-resources server creates and renames its socket there, and
    /// a rename whose two paths are looked up on either side of that mount
    /// fails ("invalid cross-device link").
    pub(crate) fn share(&self, path: &Path) -> Result<(), Error> {
        let path_text = path.display().to_string();
        self.mount(path, &["--bind", &path_text])?;
        self.mount(path, &["--make-rshared"])
    }

    /// Gives the mount at `target` (a mount point already, such as a
    /// [`MountNamespace::bind`]) shared propagation, as a path under `/`
    /// has on a real node.
    pub(crate) fn make_shared(&self, target: &Path) -> Result<(), Error> {
        self.mount(target, &["--make-rshared"])
    }

    /// Runs `mount <args> <target>` inside the namespace.
    fn mount(&self, target: &Path, args: &[&str]) -> Result<(), Error> {
        let mut all: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        all.push(target.display().to_string());
        let output = Command::new("nsenter")
            .args(self.enter_args(Path::new("mount"), &all))
            .output()
            .map_err(Error::io("run nsenter", target))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "mount {} failed: {}",
                all.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }
}
