//! `tessera-node-agent`: see `tessera_node_agent::app`.

#![forbid(unsafe_code)]

use clap::Parser;
use tessera_node_agent::app::{Args, client, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Bad flags and settings are reported before anything connects.
    let defaults = args.load_defaults()?;
    let provider = tessera_telemetry::init("tessera-node-agent", &args.log)?;
    let client = client(&args).await?;
    let result = run(args, defaults, client).await;
    if let Some(provider) = provider {
        let _ = provider.shutdown();
    }
    Ok(result?)
}
