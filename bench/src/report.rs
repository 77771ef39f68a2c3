//! The figures of a run as CSV (one row per size, the input of
//! `hack/plot-scale.py`) and as text for the terminal.

use std::fmt::Write as _;

use crate::run::{Figures, QUIET_LIMIT, QUIET_WRITES_PER_SECOND};

/// The CSV header.
pub const HEADER: &str = "nodes,gpus,background_pods,fleet_s,background_s,plain_pods_per_s,gpu_pods_per_s,\
filter_p50_ms,filter_p99_ms,prioritize_p50_ms,prioritize_p99_ms,bind_p50_ms,bind_p99_ms,\
http_filter_prioritize_p50_ms,http_filter_prioritize_p99_ms,api_requests_per_gpu_pod,\
api_requests_per_plain_pod,controller_rss_idle_mib,controller_rss_after_mib,controller_peak_rss_mib,\
controller_cpu_ms_per_gpu_pod,restart_to_ready_s,restart_to_first_bind_s,lock_wait_p50_ms,\
lock_wait_p90_ms,lock_wait_p99_ms,lock_waits,sent_nodes,http_filter_prioritize_sent_p50_ms,\
http_filter_prioritize_sent_p99_ms";

/// Total requests per pod.
pub fn total(requests: &[(String, f64)]) -> f64 {
    requests.iter().map(|(_, n)| n).sum()
}

/// The part of `requests` per pod that goes on whether pods come or not:
/// Lease renewals (kube-apiserver's identity Lease, the controller's leader
/// Lease), which a burst's window happens to contain.
pub fn time_based(requests: &[(String, f64)]) -> f64 {
    requests
        .iter()
        .filter(|(request, _)| request.split(' ').nth(1) == Some("leases"))
        .map(|(_, n)| n)
        .sum()
}

/// One CSV row.
pub fn row(f: &Figures) -> String {
    let values = [
        f.nodes as f64,
        f64::from(f.gpus),
        f.background as f64,
        f.setup_seconds.0,
        f.setup_seconds.1,
        f.plain_rate,
        f.gpu_rate,
        f.filter_ms.0,
        f.filter_ms.1,
        f.prioritize_ms.0,
        f.prioritize_ms.1,
        f.bind_ms.0,
        f.bind_ms.1,
        f.http_ms.0,
        f.http_ms.1,
        total(&f.requests_per_gpu_pod),
        total(&f.requests_per_plain_pod),
        f.idle.rss_mib,
        f.after.rss_mib,
        f.after.peak_rss_mib,
        f.cpu_ms_per_pod,
        f.restart_ready_seconds,
        f.restart_bind_seconds,
        f.lock_wait_ms.0,
        f.lock_wait_ms.1,
        f.lock_wait_ms.2,
        f.lock_waits,
        f.sent_nodes as f64,
        f.http_sent_ms.0,
        f.http_sent_ms.1,
    ];
    values
        .iter()
        .map(|v| format!("{v:.3}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The API requests per pod of both bursts as CSV rows (`nodes,burst,request,per_pod`).
pub fn request_rows(f: &Figures) -> String {
    let mut out = String::new();
    for (burst, requests) in [
        ("gpu", &f.requests_per_gpu_pod),
        ("plain", &f.requests_per_plain_pod),
    ] {
        for (request, n) in requests {
            let _ = writeln!(out, "{},{burst},{request},{n:.3}", f.nodes);
        }
    }
    out
}

/// CPU seconds per component in both burst windows as CSV rows
/// (`nodes,component,plain_window_cpu_s,gpu_window_cpu_s`).
pub fn cpu_rows(f: &Figures) -> String {
    let mut out = String::new();
    for (component, plain, gpu) in &f.cpu_by_component {
        let _ = writeln!(out, "{},{component},{plain:.3},{gpu:.3}", f.nodes);
    }
    out
}

/// The figures as text.
pub fn text(f: &Figures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} nodes x {} GPUs, {} background pods (fleet {:.0} s, background {:.0} s)",
        f.nodes, f.gpus, f.background, f.setup_seconds.0, f.setup_seconds.1
    );
    let _ = writeln!(
        out,
        "  pods/s: plain {:.1}, GPU {:.1} ({:.0} % of plain)",
        f.plain_rate,
        f.gpu_rate,
        100.0 * f.gpu_rate / f.plain_rate
    );
    let quiet = |waited: Option<f64>| {
        waited.map_or_else(
            || format!("still busy after {} s", QUIET_LIMIT.as_secs()),
            |s| format!("{s:.0} s"),
        )
    };
    let _ = writeln!(
        out,
        "  waited for the API server to be quiet (< {QUIET_WRITES_PER_SECOND} writes/s): {} before the plain burst, {} before the GPU burst",
        quiet(f.quiet_seconds.0),
        quiet(f.quiet_seconds.1)
    );
    let _ = writeln!(
        out,
        "  created in {:.1} s (GPU, through the webhook) and {:.1} s (plain); GPU pods went to {} nodes, at most {} on one",
        f.created_seconds.0, f.created_seconds.1, f.gpu_spread.0, f.gpu_spread.1
    );
    let _ = writeln!(
        out,
        "  extender p50/p99 ms: filter {:.2}/{:.2}, prioritize {:.2}/{:.2}, bind {:.2}/{:.2}; over HTTP, filter+prioritize of the {} nodes kube-scheduler sends {:.2}/{:.2}, of all nodes {:.2}/{:.2} (of which the client's JSON {:.2}/{:.2})",
        f.filter_ms.0,
        f.filter_ms.1,
        f.prioritize_ms.0,
        f.prioritize_ms.1,
        f.bind_ms.0,
        f.bind_ms.1,
        f.sent_nodes,
        f.http_sent_ms.0,
        f.http_sent_ms.1,
        f.http_ms.0,
        f.http_ms.1,
        f.http_client_ms.0,
        f.http_client_ms.1
    );
    let _ = writeln!(
        out,
        "  controller: RSS {:.0} MiB idle (peak {:.0} MiB by then), {:.0} MiB after, peak {:.0} MiB; {:.2} CPU ms per GPU pod",
        f.idle.rss_mib,
        f.idle.peak_rss_mib,
        f.after.rss_mib,
        f.after.peak_rss_mib,
        f.cpu_ms_per_pod
    );
    let _ = writeln!(
        out,
        "  restart: ready in {:.2} s, first bind {:.2} s after the restart",
        f.restart_ready_seconds, f.restart_bind_seconds
    );
    let _ = writeln!(
        out,
        "  NodeLock wait p50/p90/p99 ms: {:.2}/{:.2}/{:.2} over {:.0} binds",
        f.lock_wait_ms.0, f.lock_wait_ms.1, f.lock_wait_ms.2, f.lock_waits
    );
    let cpu: Vec<String> = f
        .cpu_by_component
        .iter()
        .map(|(name, plain, gpu)| format!("{name} {plain:.1}/{gpu:.1}"))
        .collect();
    let _ = writeln!(
        out,
        "  CPU s in the plain ({:.1} s) / GPU ({:.1} s) burst windows: {}",
        f.windows.0,
        f.windows.1,
        cpu.join(", ")
    );
    let failures: Vec<String> = f
        .failures
        .iter()
        .map(|(k, n)| format!("{k} {n:.0}"))
        .collect();
    let failures = if failures.is_empty() {
        "none".to_owned()
    } else {
        failures.join(", ")
    };
    let _ = writeln!(out, "  extender failures in the GPU burst: {failures}");
    for (burst, requests) in [
        ("GPU", &f.requests_per_gpu_pod),
        ("plain", &f.requests_per_plain_pod),
    ] {
        let listed: Vec<String> = requests
            .iter()
            .map(|(k, n)| format!("{k} {n:.2}"))
            .collect();
        let _ = writeln!(
            out,
            "  API requests per {burst} pod: {:.3} ({}); {:.3} without Lease renewals, which go on with no pods",
            total(requests),
            listed.join(", "),
            total(requests) - time_based(requests)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_renewals_are_told_apart_from_what_pods_cost() {
        let requests = [
            ("POST pods".to_owned(), 1.0),
            ("PUT nodelocks".to_owned(), 1.0),
            ("PUT leases".to_owned(), 0.006),
            ("GET leases (404)".to_owned(), 0.001),
            ("POST leasesets".to_owned(), 0.5),
        ];
        assert!((total(&requests) - 2.507).abs() < 1e-9);
        assert!((time_based(&requests) - 0.007).abs() < 1e-9);
    }
}
