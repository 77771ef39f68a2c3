//! Faults for chaos tests: killing what runs inside a pod the way a crash
//! or the OOM killer does.

use std::fs;

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::error::Error;

/// SIGKILLs every process of the pod `pod_uid` whose command name
/// (`/proc/<pid>/comm`, its first 15 bytes) starts with `comm`'s first 15; returns their
/// pids. The pod is found by its cgroup (`…/pod<uid>/…` with the cgroupfs
/// driver, `…pod<uid with _>.slice…` with systemd's).
pub fn kill_in_pod(pod_uid: &str, comm: &str) -> Result<Vec<u32>, Error> {
    let cgroupfs = format!("/pod{pod_uid}/");
    let systemd = format!("pod{}.slice", pod_uid.replace('-', "_"));
    // The kernel keeps the first 15 bytes of a command's name.
    let comm = comm.get(..comm.len().min(15)).unwrap_or(comm);
    let mut killed = Vec::new();
    let proc = fs::read_dir("/proc").map_err(Error::io("list", "/proc"))?;
    for entry in proc.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let (Ok(cgroup), Ok(name)) = (
            fs::read_to_string(format!("/proc/{pid}/cgroup")),
            fs::read_to_string(format!("/proc/{pid}/comm")),
        ) else {
            continue; // gone meanwhile
        };
        let in_pod = cgroup.contains(&cgroupfs) || cgroup.contains(&systemd);
        if in_pod && name.trim_end().starts_with(comm) {
            let target = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
            if kill(target, Signal::SIGKILL).is_ok() {
                killed.push(pid);
            }
        }
    }
    Ok(killed)
}
