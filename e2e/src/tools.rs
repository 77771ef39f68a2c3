//! Finds the control-plane binaries, building them with `hack/tools.sh` when missing.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::error::Error;

/// Names of the binaries every local cluster runs (`hack/tools.sh demo`
/// builds them, for `make demo`).
pub const BINARIES: [&str; 8] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "helm",
];

/// Binaries only the tests and benchmarks run, which `hack/tools.sh demo`
/// leaves out: looked for when asked for ([`binary`]).
const TESTS_ONLY: [&str; 1] = ["kwok"];

/// The directory holding [`BINARIES`] (etcd, the Kubernetes binaries,
/// helm) and, once the tests' tools are built, kwok.
///
/// `TESSERA_TOOLS_DIR` wins when set (the Makefile sets it). Otherwise
/// `hack/tools.sh` is asked, which builds the binaries into the cache on first
/// use (about 10 minutes cold) and prints where they are.
pub fn bin_dir() -> Result<PathBuf, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(locate).clone().map_err(Error::Tools)
}

/// The Kubernetes server and node binaries [`use_oldest_kubernetes`]
/// swaps (kubectl and helm stay the current ones).
const SERVER_AND_NODE: [&str; 5] = [
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "kube-proxy",
];

/// Where [`SERVER_AND_NODE`] come from when not from [`bin_dir`].
static KUBERNETES_DIR: OnceLock<PathBuf> = OnceLock::new();

/// The path of one binary.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    if SERVER_AND_NODE.contains(&name)
        && let Some(dir) = KUBERNETES_DIR.get()
    {
        return Ok(dir.join(name));
    }
    let dir = bin_dir()?;
    if TESTS_ONLY.contains(&name) && !dir.join(name).is_file() {
        return Err(Error::Tools(format!(
            "{} has no {name}: `make demo` builds only the demo's tools; run hack/tools.sh",
            dir.display()
        )));
    }
    Ok(dir.join(name))
}

/// Jaeger (`hack/tools.sh` builds it into `<bin>/jaeger`, for the demo
/// and the trace test).
pub fn jaeger() -> Result<PathBuf, Error> {
    let path = bin_dir()?.join("jaeger/jaeger");
    if !path.is_file() {
        return Err(Error::Tools(format!(
            "{} is missing; run hack/tools.sh",
            path.display()
        )));
    }
    Ok(path)
}

/// Makes this process's clusters run the oldest Kubernetes the docs claim
/// (`hack/tools.sh` builds it into `<bin>/oldest`): its API server,
/// scheduler, controller manager, kubelet and kube-proxy. Call it before
/// anything starts; returns the version, e.g. `v1.30.14`.
pub fn use_oldest_kubernetes() -> Result<String, Error> {
    let dir = bin_dir()?.join("oldest");
    let stamp = dir.join(".complete");
    let stamp = std::fs::read_to_string(&stamp).map_err(|e| {
        Error::Tools(format!(
            "{} is missing ({e}); run hack/tools.sh",
            stamp.display()
        ))
    })?;
    if let Some(missing) = SERVER_AND_NODE.iter().find(|b| !dir.join(b).is_file()) {
        return Err(Error::Tools(format!(
            "{} has no {missing}; run hack/tools.sh",
            dir.display()
        )));
    }
    let version = stamp
        .trim()
        .split('-')
        .next()
        .unwrap_or_default()
        .to_owned();
    if KUBERNETES_DIR.get_or_init(|| dir.clone()) != &dir {
        return Err(Error::Tools(
            "this process already runs another Kubernetes".into(),
        ));
    }
    Ok(version)
}

/// The minor version of the kubelet this process runs (36 for v1.36.3),
/// from its `--version`.
pub fn kubelet_minor() -> Result<u32, Error> {
    let kubelet = binary("kubelet")?;
    let output = Command::new(&kubelet)
        .arg("--version")
        .output()
        .map_err(Error::io("run", &kubelet))?;
    let text = String::from_utf8_lossy(&output.stdout);
    minor_of(&text).ok_or_else(|| {
        Error::Tools(format!(
            "{} --version said {text:?}, not Kubernetes v1.<minor>.<patch>",
            kubelet.display()
        ))
    })
}

/// The minor version in `Kubernetes v1.36.3`.
fn minor_of(version: &str) -> Option<u32> {
    let version = version.trim().rsplit(' ').next()?.strip_prefix("v1.")?;
    version.split('.').next()?.parse().ok()
}

/// A program from the system's packages (promtool, prometheus, busybox):
/// on `PATH`, or in `/usr/bin` where Debian puts it; the error names the
/// Debian `package` that installs it.
pub fn system_program(name: &str, package: &str) -> Result<PathBuf, Error> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Tools(format!(
                "{name} not found (on PATH or /usr/bin): install Debian's {package} package, for \
                 example with `sudo hack/node-deps.sh`"
            ))
        })
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
    match missing(&dir) {
        Some(missing) => Err(format!(
            "{} has no {missing}; run hack/tools.sh",
            dir.display()
        )),
        None => Ok(dir),
    }
}

/// The first of [`BINARIES`] that `dir` lacks.
fn missing(dir: &Path) -> Option<&'static str> {
    BINARIES.iter().find(|b| !dir.join(b).is_file()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_s_tools_are_enough_to_run_a_cluster() {
        let dir = tempfile::tempdir().unwrap();
        for name in BINARIES {
            assert_eq!(missing(dir.path()), Some(name));
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        // `hack/tools.sh demo` builds no kwok, and `make demo` runs none.
        assert_eq!(missing(dir.path()), None);
        assert!(!TESTS_ONLY.iter().any(|t| BINARIES.contains(t)));
    }

    #[test]
    fn the_minor_version_is_read_from_the_kubelet_s_words() {
        assert_eq!(minor_of("Kubernetes v1.36.3\n"), Some(36));
        assert_eq!(minor_of("Kubernetes v1.30.14"), Some(30));
        assert_eq!(minor_of("Kubernetes v2.0.0"), None);
        assert_eq!(minor_of(""), None);
    }
}
