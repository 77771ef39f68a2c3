//! One cgroup subtree per real node: the kubelet's `cgroupRoot` (pods go
//! below it) and `runtime`, where containerd and its shims run. Teardown kills
//! everything in the subtree and removes it, so no container survives a node.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::Error;

const ROOT: &str = "/sys/fs/cgroup";

/// A node's cgroup subtree, `/<name>` in every hierarchy.
#[derive(Debug, Clone)]
pub(crate) struct Subtree {
    name: String,
}

/// The mounted hierarchies: the unified one (cgroup v2), or every v1
/// hierarchy (the named `systemd` one included; the kubelet checks it).
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_owned()];
    }
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n != "unified"))
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    found.sort();
    found
}

impl Subtree {
    /// Creates `/<name>` and `/<name>/runtime` in every hierarchy.
    pub(crate) fn create(name: &str) -> Result<Self, Error> {
        let subtree = Self {
            name: name.to_owned(),
        };
        let hierarchies = hierarchies();
        if hierarchies.is_empty() {
            return Err(Error::Config(format!("no cgroup hierarchy under {ROOT}")));
        }
        for hierarchy in hierarchies {
            if hierarchy.join("cgroup.controllers").exists() {
                // v2: let the subtree use the controllers the kubelet needs.
                let _ = fs::write(
                    hierarchy.join("cgroup.subtree_control"),
                    "+cpu +cpuset +memory +pids",
                );
            }
            let dir = hierarchy.join(name);
            for dir in [dir.clone(), dir.join("runtime")] {
                fs::create_dir_all(&dir).map_err(Error::io("create cgroup", &dir))?;
                if hierarchy.ends_with("cpuset") {
                    // A v1 cpuset cgroup takes no task before it has CPUs and memory nodes.
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        let parent = dir.parent().unwrap_or(&hierarchy).join(file);
                        let value = fs::read_to_string(&parent)
                            .map_err(Error::io("read cpuset", &parent))?;
                        fs::write(dir.join(file), value.trim())
                            .map_err(Error::io("write cpuset", dir.join(file)))?;
                    }
                }
            }
            if hierarchy.join("cgroup.controllers").exists() {
                let _ = fs::write(
                    hierarchy.join(name).join("cgroup.subtree_control"),
                    "+cpu +cpuset +memory +pids",
                );
            }
        }
        Ok(subtree)
    }

    /// A subtree created earlier (to destroy it).
    pub(crate) fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
        }
    }

    /// Its name: `/<name>` in every hierarchy.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The kubelet's `cgroupRoot`.
    pub(crate) fn kubelet_root(&self) -> String {
        format!("/{}", self.name)
    }

    /// Moves `pid` into `runtime` in every hierarchy; what it starts later
    /// (containerd's shims) stays inside.
    pub(crate) fn adopt(&self, pid: u32) -> Result<(), Error> {
        for hierarchy in hierarchies() {
            let procs = hierarchy.join(&self.name).join("runtime/cgroup.procs");
            fs::write(&procs, pid.to_string()).map_err(Error::io("join cgroup", &procs))?;
        }
        Ok(())
    }

    /// SIGKILLs every process in the subtree until none is left (10 s at
    /// most), then removes the subtree from every hierarchy.
    pub(crate) fn destroy(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for hierarchy in hierarchies() {
            remove_tree(&hierarchy.join(&self.name));
        }
    }

    fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for hierarchy in hierarchies() {
            collect_pids(&hierarchy.join(&self.name), &mut pids);
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

fn collect_pids(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&entry.path(), pids);
            }
        }
    }
}

/// Removes a cgroup directory and its children, deepest first (cgroup
/// directories are removed with rmdir, never by deleting their files).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}
