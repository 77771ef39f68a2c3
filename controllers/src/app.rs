//! The `tessera-controller` process: flags and wiring.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use clap::Parser;
use tokio::net::TcpListener;

use crate::{Error, config::Config, extender::Extender, projection::Projection};

/// Tessera's control plane: kube-scheduler extender (filter, prioritize, bind).
#[derive(Parser, Debug, Clone)]
#[command(name = "tessera-controller", version, about)]
pub struct Args {
    /// Cluster-wide settings (YAML): resource names, request defaults,
    /// policies, NodeLock timing. See docs/configuration.md.
    #[arg(long, env = "TESSERA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address the extender listens on (plain HTTP; kube-scheduler runs beside it).
    #[arg(long, env = "TESSERA_EXTENDER_ADDR", default_value = "127.0.0.1:8888")]
    pub extender_addr: SocketAddr,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "TESSERA_LOG", default_value = "info")]
    pub log: String,
}

impl Args {
    /// Reads the configuration file, or the defaults without one.
    pub fn load_config(&self) -> Result<Config, Error> {
        let Some(path) = &self.config else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Config::from_yaml(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }
}

/// Runs the controller until the process is stopped.
pub async fn run(args: Args, client: kube::Client) -> anyhow::Result<()> {
    let Args {
        config: _,
        extender_addr,
        log: _,
    } = &args;
    let config = Arc::new(args.load_config()?);
    let projection = Projection::spawn(client.clone());
    let listener = TcpListener::bind(extender_addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "extender listening");
    serve_extender(listener, client, projection, config).await
}

/// Serves the extender on `listener` until the task is dropped.
pub async fn serve_extender(
    listener: TcpListener,
    client: kube::Client,
    projection: Projection,
    config: Arc<Config>,
) -> anyhow::Result<()> {
    let router = Extender::new(client, projection, config).router();
    axum::serve(listener, router).await?;
    Ok(())
}
