//! The images Tessera is installed from (what `make images` writes):
//!
//! - `tessera-controller`: the extender, webhook and lifecycle controllers;
//!   runs as 65532.
//! - `tessera-node-agent`: the agent and the interposer at
//!   [`INTERPOSER_PATH`], which the agent copies onto the host at start-up;
//!   runs as root.
//! - `kube-scheduler`: the v1.36 binary `hack/tools.sh` builds; runs as 65532.
//!
//! Each holds its program, exactly the shared libraries `ldd` names for it
//! (loader included), its one account, `/tmp`, and for the two Tessera
//! binaries this machine's CA bundle (their Kubernetes client falls back to
//! the system roots when a kubeconfig names no CA).

use std::path::{Path, PathBuf};
use std::process::Command;

use oci_spec::image::{ANNOTATION_SOURCE, ANNOTATION_TITLE, ANNOTATION_VERSION};

use super::rootfs::{self, Account};
use crate::error::Error;
use crate::oci::{Archive, Image};

/// The registry Tessera's images are named for unless told otherwise.
pub const DEFAULT_REGISTRY: &str = "ghcr.io/tessera-gpu";
/// Tessera's version (the workspace's): the tag of its images unless told
/// otherwise.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The repository of the kube-scheduler image; its tag is the binary's
/// version (`v1.36.3`).
pub const KUBE_SCHEDULER_REPOSITORY: &str = "tessera.local/kube-scheduler";
/// Where the agent image holds the interposer (the chart's
/// `--install-interposer-from`).
pub const INTERPOSER_PATH: &str = "/opt/tessera/lib/libtessera_vgpu.so";
/// Where images hold the CA bundle (`SSL_CERT_FILE`).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

const TESSERA_SOURCE: &str = env!("CARGO_PKG_REPOSITORY");
const KUBERNETES_SOURCE: &str = "https://github.com/kubernetes/kubernetes";

/// The files the three images are built from.
#[derive(Debug, Clone)]
pub struct ComponentInputs {
    /// `tessera-controller`.
    pub controller: PathBuf,
    /// `tessera-node-agent`.
    pub agent: PathBuf,
    /// `libtessera_vgpu.so`, the interposer.
    pub interposer: PathBuf,
    /// `kube-scheduler` (static).
    pub kube_scheduler: PathBuf,
    /// kube-scheduler's version as it reports it (`v1.36.3`).
    pub kube_scheduler_version: String,
    /// The CA bundle for the images that need one (this machine's
    /// `/etc/ssl/certs/ca-certificates.crt`).
    pub ca_certificates: PathBuf,
}

impl ComponentInputs {
    /// The build outputs in `artifacts` (a cargo target directory's `debug`
    /// or `release`) and kube-scheduler in `tools` (`hack/tools.sh --path`);
    /// asks kube-scheduler its version. Fails naming whatever is missing.
    pub fn in_dirs(artifacts: &Path, tools: &Path) -> Result<Self, Error> {
        Self::new(
            artifacts.join("tessera-controller"),
            artifacts.join("tessera-node-agent"),
            artifacts.join("libtessera_vgpu.so"),
            tools.join("kube-scheduler"),
        )
    }

    /// These files, with this machine's CA bundle; asks kube-scheduler its
    /// version.
    pub fn new(
        controller: PathBuf,
        agent: PathBuf,
        interposer: PathBuf,
        kube_scheduler: PathBuf,
    ) -> Result<Self, Error> {
        let ca_certificates = PathBuf::from(CA_BUNDLE);
        let missing: Vec<String> = [
            &controller,
            &agent,
            &interposer,
            &kube_scheduler,
            &ca_certificates,
        ]
        .into_iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
        if !missing.is_empty() {
            return Err(Error::Config(format!(
                "missing {} (build with `cargo build --release -p tessera-controllers -p tessera-node-agent -p tessera-interposer`, tools with hack/tools.sh, CA certificates with the ca-certificates package)",
                missing.join(", ")
            )));
        }
        Ok(Self {
            kube_scheduler_version: kube_version(&kube_scheduler)?,
            controller,
            agent,
            interposer,
            kube_scheduler,
            ca_certificates,
        })
    }
}

/// How the images are named and stamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageOptions {
    /// The registry (and namespace) of Tessera's images, e.g.
    /// [`DEFAULT_REGISTRY`].
    pub registry: String,
    /// The tag of Tessera's images, e.g. [`VERSION`].
    pub tag: String,
    /// The mtime of every file, in seconds since the epoch
    /// (`SOURCE_DATE_EPOCH`; 0 by default).
    pub mtime: u64,
}

impl Default for ImageOptions {
    fn default() -> Self {
        Self {
            registry: DEFAULT_REGISTRY.to_owned(),
            tag: VERSION.to_owned(),
            mtime: 0,
        }
    }
}

/// Writes `tessera-controller.tar`, `tessera-node-agent.tar` and
/// `kube-scheduler.tar` into `out_dir` (created if missing) and returns them
/// in that order with their references and manifest digests.
pub fn build_components(
    out_dir: &Path,
    inputs: &ComponentInputs,
    options: &ImageOptions,
) -> Result<Vec<Archive>, Error> {
    std::fs::create_dir_all(out_dir).map_err(Error::io("create directory", out_dir))?;
    let registry = options.registry.trim_end_matches('/');
    let tessera = |name: &str| format!("{registry}/{name}:{}", options.tag);
    let images = [
        controller(&tessera("tessera-controller"), inputs)?,
        agent(&tessera("tessera-node-agent"), inputs)?,
        kube_scheduler(inputs)?,
    ];
    images
        .into_iter()
        .map(|(file, mut image)| {
            image.mtime(options.mtime);
            image.write_archive(&out_dir.join(file))
        })
        .collect()
}

fn controller(name: &str, inputs: &ComponentInputs) -> Result<(&'static str, Image), Error> {
    let mut image = program(
        name,
        "tessera-controller",
        &inputs.controller,
        Account::NONROOT,
    )?;
    ca_bundle(&mut image, inputs)?;
    labels(&mut image, TESSERA_SOURCE, VERSION, "tessera-controller");
    Ok(("tessera-controller.tar", image))
}

fn agent(name: &str, inputs: &ComponentInputs) -> Result<(&'static str, Image), Error> {
    let mut image = program(name, "tessera-node-agent", &inputs.agent, Account::ROOT)?;
    image.copy(INTERPOSER_PATH, &inputs.interposer)?;
    ca_bundle(&mut image, inputs)?;
    labels(&mut image, TESSERA_SOURCE, VERSION, "tessera-node-agent");
    Ok(("tessera-node-agent.tar", image))
}

fn kube_scheduler(inputs: &ComponentInputs) -> Result<(&'static str, Image), Error> {
    let version = &inputs.kube_scheduler_version;
    let name = format!("{KUBE_SCHEDULER_REPOSITORY}:{version}");
    let mut image = program(
        &name,
        "kube-scheduler",
        &inputs.kube_scheduler,
        Account::NONROOT,
    )?;
    labels(&mut image, KUBERNETES_SOURCE, version, "kube-scheduler");
    Ok(("kube-scheduler.tar", image))
}

/// An image of one program at `/usr/local/bin/<program>` (on `PATH`, and the
/// entrypoint) running as `account`.
fn program(name: &str, program: &str, binary: &Path, account: Account) -> Result<Image, Error> {
    let path = format!("/usr/local/bin/{program}");
    let mut image = Image::new(name);
    rootfs::base(&mut image, account, "/sbin/nologin");
    rootfs::program(&mut image, &path, binary)?;
    image.entrypoint(&[&path]).user(&account.user());
    Ok(image)
}

fn ca_bundle(image: &mut Image, inputs: &ComponentInputs) -> Result<(), Error> {
    image
        .copy(CA_BUNDLE, &inputs.ca_certificates)?
        .env("SSL_CERT_FILE", CA_BUNDLE);
    Ok(())
}

fn labels(image: &mut Image, source: &str, version: &str, title: &str) {
    image
        .label(ANNOTATION_SOURCE, source)
        .label(ANNOTATION_VERSION, version)
        .label(ANNOTATION_TITLE, title);
}

/// A Kubernetes binary's version: `kube-scheduler --version` prints
/// `Kubernetes v1.36.3`.
fn kube_version(binary: &Path) -> Result<String, Error> {
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(Error::io("run", binary))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut words = text.split_whitespace();
    (words.next() == Some("Kubernetes"))
        .then(|| words.next())
        .flatten()
        .filter(|v| output.status.success() && v.starts_with('v'))
        .map(str::to_owned)
        .ok_or_else(|| {
            Error::Config(format!(
                "{} --version printed {:?}, not `Kubernetes v…`",
                binary.display(),
                text.trim()
            ))
        })
}
