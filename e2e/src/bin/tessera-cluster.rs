//! `tessera-cluster`: a persistent local control plane for development
//! (`make cluster` / `make cluster-down`).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use tessera_e2e::{ControlPlane, Lifetime, Options, tools};

/// Runs etcd and kube-apiserver v1.36 on loopback with Tessera's CRDs installed.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory for the cluster's state, logs, credentials and kubeconfig.
    #[arg(
        long,
        env = "TESSERA_CLUSTER_DIR",
        default_value = ".tessera",
        global = true
    )]
    dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the control plane (or report the one already running) and print how to use it.
    Up,
    /// Stop the control plane and remove its directory.
    Down,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args { dir, command } = Args::parse();
    match command {
        Command::Up => up(&dir).await,
        Command::Down => {
            let stopped = tessera_e2e::stop_detached(&dir)
                .with_context(|| format!("stopping the cluster in {}", dir.display()))?;
            eprintln!(
                "stopped {} process(es); removed {}",
                stopped.len(),
                dir.display()
            );
            Ok(())
        }
    }
}

async fn up(dir: &Path) -> anyhow::Result<()> {
    let kubeconfig = dir.join("kubeconfig");
    if kubeconfig.exists() && responds(&kubeconfig).await {
        eprintln!("a Tessera cluster is already running in {}", dir.display());
    } else {
        // Clear whatever a crashed or half-stopped cluster left behind.
        tessera_e2e::stop_detached(dir).with_context(|| format!("clearing {}", dir.display()))?;
        let options = Options {
            dir: Some(dir.to_path_buf()),
            lifetime: Lifetime::Detached,
            install_crds: true,
            serve_pods: false,
            ..Options::default()
        };
        let cluster = ControlPlane::start_with(options)
            .await
            .context("starting the control plane")?;
        cluster
            .detach()
            .context("recording the cluster's processes")?;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        let link = bin.join("kubectl");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(tools::binary("kubectl")?, &link)?;
    }
    let dir = std::path::absolute(dir)?;
    eprintln!(
        "\nTessera's CRDs are installed. To use the cluster:\n\n  export KUBECONFIG={kc}\n  export PATH={bin}:$PATH   # kubectl v1.36\n  kubectl get crd\n  kubectl get vgpuallocations -A\n\nLogs: {dir}/*.log\nStop it with: make cluster-down",
        kc = dir.join("kubeconfig").display(),
        bin = dir.join("bin").display(),
        dir = dir.display(),
    );
    Ok(())
}

/// Whether the API server behind this kubeconfig answers.
async fn responds(kubeconfig: &Path) -> bool {
    let Ok(config) = kube::config::Kubeconfig::read_from(kubeconfig) else {
        return false;
    };
    let Ok(config) = kube::Config::from_custom_kubeconfig(config, &Default::default()).await else {
        return false;
    };
    let Ok(client) = kube::Client::try_from(config) else {
        return false;
    };
    client.apiserver_version().await.is_ok()
}
