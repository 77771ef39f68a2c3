//! Finds the control-plane binaries, building them with `hack/tools.sh` when missing.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::error::Error;

/// Names of the binaries the harness runs.
pub const BINARIES: [&str; 9] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "helm",
    "kwok",
];

/// The directory holding [`BINARIES`]: etcd, the Kubernetes binaries, helm and kwok.
///
/// `TESSERA_TOOLS_DIR` wins when set (the Makefile sets it). Otherwise
/// `hack/tools.sh` is asked, which builds the binaries into the cache on first
/// use (about 10 minutes cold) and prints where they are.
pub fn bin_dir() -> Result<PathBuf, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(locate).clone().map_err(Error::Tools)
}

/// The path of one binary.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    Ok(bin_dir()?.join(name))
}

/// The repository root (the workspace containing this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn locate() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("TESSERA_TOOLS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = repo_root().join("hack/tools.sh");
            let output = Command::new("bash")
                .arg(&script)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !output.status.success() {
                return Err(format!(
                    "{} failed: {}",
                    script.display(),
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
            PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        }
    };
    match BINARIES.iter().find(|b| !dir.join(b).is_file()) {
        Some(missing) => Err(format!(
            "{} has no {missing}; run hack/tools.sh",
            dir.display()
        )),
        None => Ok(dir),
    }
}
