//! Nanoseconds the interposer adds to a `cuLaunchKernel`, against the fake
//! driver called directly (issue 5, section 7).
//!
//! `cargo bench -p tessera-interposer --bench launch`. Each row runs the
//! linked C probe's `launchbench` as its own process, three times (the table
//! shows the median run by p50). Launches are timed in batches of 10 because
//! the clock of some virtual machines ticks in 10 ns steps; p50 and p99 are
//! over batches, per launch. Rows: without the preload, preloaded without a
//! compute limit, preloaded with `CUDA_DEVICE_SM_LIMIT=100` (HAMi's "no
//! limit"), and, for scale, preloaded with a 50 % limit that never binds
//! (launches take no simulated time, so the budget stays full): the cost of
//! the limited path itself (current context, capture check, two events,
//! polling earlier events).

use support::{Loader, World};

fn main() {
    // Batches of 10 launches (see the probe): 2,000,000 launches per row.
    let batches_total = 200_000u64;
    println!("| threads | configuration | p50 ns | p99 ns | mean ns | added p50 ns |");
    println!("|---|---|---|---|---|---|");
    for threads in [1u64, 8] {
        let rounds = (batches_total / threads).to_string();
        let args = ["launchbench", &threads.to_string(), &rounds];
        let mut baseline = None;
        for (name, preload, limit) in [
            ("fake driver directly", false, None),
            ("preloaded, no limit", true, None),
            ("preloaded, limit 100", true, Some("100")),
            ("preloaded, limit 50 (never binds)", true, Some("50")),
        ] {
            let mut runs: Vec<(u64, u64, u64)> = (0..3)
                .map(|_| {
                    let mut world = World::new("80g").env("FAKE_CUDA_NS_PER_BLOCK", "0");
                    if let Some(limit) = limit {
                        world = world.env("CUDA_DEVICE_SM_LIMIT", limit);
                    }
                    let report = world.run(Loader::Linked, preload, &args).ok();
                    (report.get("p50"), report.get("p99"), report.get("mean"))
                })
                .collect();
            runs.sort_unstable();
            let (p50, p99, mean) = runs[1];
            let base = *baseline.get_or_insert(p50);
            println!(
                "| {threads} | {name} | {p50} | {p99} | {mean} | {} |",
                p50 as i64 - base as i64
            );
        }
    }
}
