//! `tessera-images`: writes the OCI image archives of tessera-controller,
//! tessera-node-agent and kube-scheduler (`make images`), without a Docker
//! daemon. See docs/images.md.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use tessera_e2e::images::{self, ComponentInputs, ImageOptions};

/// Builds Tessera's container images as reproducible OCI image-layout archives.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory the archives are written to.
    #[arg(long, env = "TESSERA_IMAGES_DIR", default_value = "target/images")]
    out: PathBuf,
    /// Directory holding tessera-controller, tessera-node-agent and
    /// libtessera_vgpu.so (a cargo target directory's release or debug).
    #[arg(long, env = "TESSERA_ARTIFACTS_DIR", default_value = "target/release")]
    artifacts: PathBuf,
    /// Directory holding kube-scheduler (`hack/tools.sh --path`).
    #[arg(long, env = "TESSERA_TOOLS_DIR")]
    tools: PathBuf,
    /// Registry (and namespace) of the Tessera images' names.
    #[arg(long, env = "TESSERA_IMAGE_REGISTRY", default_value = images::DEFAULT_REGISTRY)]
    registry: String,
    /// Tag of the Tessera images (kube-scheduler's is its version).
    #[arg(long, env = "TESSERA_IMAGE_TAG", default_value = images::VERSION)]
    tag: String,
    /// Modification time of every file in the images, in seconds since the epoch.
    #[arg(long, env = "SOURCE_DATE_EPOCH", default_value_t = 0)]
    source_date_epoch: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = Instant::now();
    let inputs = ComponentInputs::in_dirs(&args.artifacts, &args.tools)?;
    let options = ImageOptions {
        registry: args.registry,
        tag: args.tag,
        mtime: args.source_date_epoch,
    };
    let archives = images::build_components(&args.out, &inputs, &options)
        .with_context(|| format!("writing images into {}", args.out.display()))?;
    for archive in &archives {
        let size = std::fs::metadata(&archive.path).map_or(0, |m| m.len());
        println!(
            "{}\n  {}\n  {} ({:.1} MiB)",
            archive.reference,
            archive.digest,
            archive.path.display(),
            size as f64 / (1024.0 * 1024.0)
        );
    }
    eprintln!(
        "built {} images in {:.1} s",
        archives.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
