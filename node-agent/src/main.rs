//! `tessera-node-agent`: see `tessera_node_agent::app`.

#![forbid(unsafe_code)]

use clap::Parser;
use tessera_node_agent::app::{Args, MpsArgs, client, run, run_mps_host};

/// jemalloc, which samples the heap for `--profiling`.
#[global_allocator]
static ALLOCATOR: tessera_profiling::Allocator = tessera_profiling::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let command_line: Vec<_> = std::env::args_os().collect();
    if let Some(args) = MpsArgs::from_command_line(&command_line) {
        let provider = tessera_telemetry::init("tessera-mps-host", &args.log)?;
        let result = run_mps_host(args).await;
        if let Some(provider) = provider {
            let _ = provider.shutdown();
        }
        return Ok(result?);
    }
    let args = Args::parse_from(command_line);
    // Bad flags and settings are reported before anything connects.
    args.check_device_list()?;
    let defaults = args.load_defaults()?;
    let provider = tessera_telemetry::init("tessera-node-agent", &args.log)?;
    let client = client(&args).await?;
    let result = run(args, defaults, client).await;
    if let Some(provider) = provider {
        let _ = provider.shutdown();
    }
    Ok(result?)
}
