//! `tessera-controller`: see `tessera_controllers::app`.

use clap::Parser;
use tessera_controllers::app::{Args, run};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&args.log)?)
        .init();
    let client = kube::Client::try_default().await?;
    run(args, client).await
}
