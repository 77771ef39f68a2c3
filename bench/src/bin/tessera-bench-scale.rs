//! `make bench-scale`: the scheduling path at 100, 1,000 and 5,000
//! simulated GPU nodes; figures on stdout and in `<out>/scale.csv`.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use clap::Parser;
use tessera_bench::{
    fleet::Shape,
    report,
    run::{Options, Running},
};
use tessera_e2e::artifacts::Artifacts;

/// Measures Tessera's scheduling path on kwok-simulated GPU nodes.
#[derive(Debug, Parser)]
struct Args {
    /// Fleet sizes to run, one fresh cluster each.
    #[arg(
        long,
        env = "BENCH_SCALE_NODES",
        value_delimiter = ',',
        default_value = "100,1000,5000"
    )]
    nodes: Vec<usize>,
    /// GPUs per node.
    #[arg(long, env = "BENCH_SCALE_GPUS", default_value_t = 8)]
    gpus: u32,
    /// Slices per GPU (deviceSplitCount).
    #[arg(long, env = "BENCH_SCALE_SPLIT", default_value_t = 10)]
    split: u32,
    /// Pods per burst (GPU and plain each).
    #[arg(long, env = "BENCH_SCALE_BURST", default_value_t = 1000)]
    burst: usize,
    /// Seed of the GPU pods' sizes.
    #[arg(long, env = "BENCH_SCALE_SEED", default_value_t = 1)]
    seed: u64,
    /// Filter+Prioritize round trips timed over HTTP.
    #[arg(long, env = "BENCH_SCALE_PROBES", default_value_t = 200)]
    probes: usize,
    /// Take a CPU profile of the controller for this many seconds from the
    /// start of each GPU burst (`<out>/cluster-<N>/cpu-gpu-burst.pb`; read it
    /// with `go tool pprof -top`). Off by default: the profiler's memory
    /// counts in the controller's figures.
    #[arg(long, env = "BENCH_SCALE_CPU_PROFILE_SECONDS")]
    cpu_profile_seconds: Option<u64>,
    /// Where scale.csv and requests.csv go.
    #[arg(long, env = "BENCH_SCALE_OUT", default_value = "target/bench-scale")]
    out: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    anyhow::ensure!(
        args.gpus > 0 && args.split > 0,
        "--gpus and --split must be at least 1"
    );
    let artifacts = Artifacts::locate().context("finding tessera-controller")?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut csv = format!("{}\n", report::HEADER);
    let mut requests = String::from("nodes,burst,request,per_pod\n");
    let mut cpu = String::from("nodes,component,plain_window_cpu_s,gpu_window_cpu_s\n");
    for &nodes in &args.nodes {
        let options = Options {
            shape: Shape {
                nodes,
                gpus: args.gpus,
                split: args.split,
            },
            burst: args.burst,
            seed: args.seed,
            probe_calls: args.probes,
            burst_limit: Duration::from_secs(1200),
            dir: Some(args.out.join(format!("cluster-{nodes}"))),
            cpu_profile_seconds: args.cpu_profile_seconds,
        };
        let running = Running::start(options, &artifacts)
            .await
            .with_context(|| format!("starting {nodes} nodes"))?;
        let figures = running
            .measure()
            .await
            .with_context(|| format!("measuring {nodes} nodes"))?;
        println!("{}", report::text(&figures));
        println!(
            "  component logs: {}",
            args.out.join(format!("cluster-{nodes}")).display()
        );
        csv.push_str(&report::row(&figures));
        csv.push('\n');
        requests.push_str(&report::request_rows(&figures));
        cpu.push_str(&report::cpu_rows(&figures));
        // Written after every size, so a later failure keeps what was measured.
        let path = args.out.join("scale.csv");
        std::fs::write(&path, &csv).with_context(|| format!("writing {}", path.display()))?;
        for (file, text) in [("requests.csv", &requests), ("cpu.csv", &cpu)] {
            let path = args.out.join(file);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        drop(running);
        // The logs stay; etcd's data (about 1 GiB at 5,000 nodes) goes.
        let data = args.out.join(format!("cluster-{nodes}")).join("etcd");
        if let Err(error) = std::fs::remove_dir_all(&data) {
            tracing::warn!(%error, dir = %data.display(), "could not remove etcd's data");
        }
    }
    println!("figures in {}", args.out.display());
    Ok(())
}
