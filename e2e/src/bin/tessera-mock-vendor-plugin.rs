//! `tessera-mock-vendor-plugin`: another vendor's device plugin (Hygon's or
//! Ascend's, as HAMi's plugins behave) for nodes without that hardware; the
//! real-node tests and `make demo` run one per vendor node
//! (`tessera_e2e::mock_vendor` says what it does and where that comes from).

#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use tessera_e2e::mock_vendor::MockPlugin;

/// Registers mock vendor devices on a Node and serves them to its kubelet.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The kubeconfig to reach the API server with.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// The plugin as JSON (`tessera_e2e::mock_vendor::MockPlugin`): vendor,
    /// node, devices, the kubelet's device-plugin directory, interval.
    #[arg(long, env = "TESSERA_MOCK_PLUGIN_SPEC")]
    spec: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.spec)
        .with_context(|| format!("reading --spec {}", args.spec.display()))?;
    let plugin: MockPlugin = serde_json::from_str(&text)
        .with_context(|| format!("--spec {}: not a mock plugin", args.spec.display()))?;
    let config = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading --kubeconfig {}", args.kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await
            .context("--kubeconfig")?;
    let client = kube::Client::try_from(config).context("building the API client")?;
    plugin.run(client).await.context("mock vendor plugin")
}
