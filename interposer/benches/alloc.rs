//! Nanoseconds the interposer adds to a `cuMemAlloc_v2` + `cuMemFree_v2`
//! pair, against the fake driver called directly (issue 5, section 7).
//!
//! `cargo bench -p tessera-interposer --bench alloc`. Each row runs the linked
//! C probe as its own process: without the preload, with it and no limit
//! (accounting only), and with a limit (accounting and the limit check).

use support::{Loader, World};

fn main() {
    let rounds_total = 400_000u64;
    println!("| threads | configuration | p50 ns | p99 ns | mean ns | added p50 ns |");
    println!("|---|---|---|---|---|---|");
    for threads in [1u64, 8] {
        let rounds = (rounds_total / threads).to_string();
        let args = ["bench", &threads.to_string(), &rounds, "4096"];
        let mut baseline = None;
        for (name, preload, limit) in [
            ("fake driver directly", false, None),
            ("preloaded, no limit", true, None),
            ("preloaded, limit 64g", true, Some("64g")),
        ] {
            let mut world = World::new("80g");
            if let Some(limit) = limit {
                world = world.env("CUDA_DEVICE_MEMORY_LIMIT", limit);
            }
            let report = world.run(Loader::Linked, preload, &args).ok();
            let (p50, p99, mean) = (report.get("p50"), report.get("p99"), report.get("mean"));
            let base = *baseline.get_or_insert(p50);
            println!(
                "| {threads} | {name} | {p50} | {p99} | {mean} | {} |",
                p50 as i64 - base as i64
            );
        }
    }
}
