//! `tessera-controller`: see `tessera_controllers::app`.

#![forbid(unsafe_code)]

use clap::Parser;
use tessera_controllers::{
    app::{Args, run},
    telemetry,
};

/// jemalloc instead of glibc's allocator: after a 1,000-pod burst at 1,000
/// nodes glibc held 400-460 MiB (also with `MALLOC_ARENA_MAX=2`) for about
/// 200 MiB of live data (docs/benchmarks.md, "Scale"); and jemalloc samples
/// the heap for `--profiling`.
#[global_allocator]
static ALLOCATOR: tessera_profiling::Allocator = tessera_profiling::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Bad flags and settings are reported before anything connects.
    let config = args.load_config()?;
    let provider = telemetry::init(&args.log)?;
    let client = kube::Client::try_default().await?;
    let result = run(args, config, client).await;
    if let Some(provider) = provider {
        let _ = provider.shutdown();
    }
    Ok(result?)
}
