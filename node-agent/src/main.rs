//! `tessera-node-agent`: see `tessera_node_agent::app`.

use clap::Parser;
use tessera_node_agent::app::{Args, client, run};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Bad flags and settings are reported before anything connects.
    let defaults = args.load_defaults()?;
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&args.log)?)
        .init();
    let client = client(&args).await?;
    run(args, defaults, client).await
}
