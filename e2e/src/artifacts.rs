//! Finds Tessera's own build outputs (binaries and shared libraries) that real
//! nodes run: `cargo build --workspace` puts them in the target directory.

use std::path::{Path, PathBuf};

use crate::{error::Error, tools};

/// Tessera's build outputs.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `tessera-controller`: extender, webhook and lifecycle controllers.
    pub controller: PathBuf,
    /// `tessera-node-agent`.
    pub agent: PathBuf,
    /// `libtessera_vgpu.so`, the interposer.
    pub interposer: PathBuf,
    /// The fake CUDA driver (`libcuda.so` from tessera-fake-cuda).
    pub fake_cuda: PathBuf,
    /// The fake NVML (`libnvidia_ml.so` from tessera-fake-nvml).
    pub fake_nvml: PathBuf,
    /// The interposer's C test client (`interposer/tests/c/probe.c`).
    pub probe_source: PathBuf,
}

impl Artifacts {
    /// `tessera-mock-vendor-plugin`, beside the node agent (built with the
    /// workspace; only vendor nodes need it, so it is looked for then).
    pub fn mock_vendor_plugin(&self) -> Result<PathBuf, Error> {
        let path = self.agent.with_file_name("tessera-mock-vendor-plugin");
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Config(format!(
                "missing build output {}; run `cargo build --workspace` first",
                path.display()
            )))
        }
    }

    /// Looks in `TESSERA_ARTIFACTS_DIR`, else `<CARGO_TARGET_DIR or
    /// target>/debug`, and fails naming whatever is missing.
    pub fn locate() -> Result<Self, Error> {
        let dir = match std::env::var_os("TESSERA_ARTIFACTS_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| tools::repo_root().join("target"), PathBuf::from)
                .join("debug"),
        };
        Self::in_dir(&dir)
    }

    /// The artifacts in one directory.
    pub fn in_dir(dir: &Path) -> Result<Self, Error> {
        let artifacts = Self {
            controller: dir.join("tessera-controller"),
            agent: dir.join("tessera-node-agent"),
            interposer: dir.join("libtessera_vgpu.so"),
            fake_cuda: dir.join("libcuda.so"),
            fake_nvml: dir.join("libnvidia_ml.so"),
            probe_source: tools::repo_root().join("interposer/tests/c/probe.c"),
        };
        let missing: Vec<String> = [
            &artifacts.controller,
            &artifacts.agent,
            &artifacts.interposer,
            &artifacts.fake_cuda,
            &artifacts.fake_nvml,
            &artifacts.probe_source,
        ]
        .into_iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
        if missing.is_empty() {
            Ok(artifacts)
        } else {
            Err(Error::Config(format!(
                "missing build outputs {}; run `cargo build --workspace` first",
                missing.join(", ")
            )))
        }
    }
}
