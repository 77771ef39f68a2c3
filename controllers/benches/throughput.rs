//! Scheduling throughput with the real kube-scheduler, in one run on one
//! local control plane: plain pods (no GPU) per second versus GPU pods per
//! second through the extender, and the API writes the extender makes per
//! GPU pod (counted on its client).
//!
//! `cargo bench -p tessera-controllers --bench throughput` (or `make bench`);
//! with `DEBUG_APISERVER=1` it also prints the API server's busiest request
//! counters, which show where the control plane's CPU goes.
//! No node agent exists yet, so the test stand-in plays its Allocate step
//! once the pod is bound (allocation Allocated, lock released); its writes
//! are not counted.

#![allow(missing_docs)]

use tessera_testkit::cluster as support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams, client::ClientBuilder};
use serde_json::{Value, json};
use support::{Cluster, spawn_allocate_stand_in};
use tessera_controllers::config::Config;
use tessera_e2e::ControlPlane;

const NODES: usize = 20;
const GPUS: u32 = 4;
const PODS: usize = 200;

type Writes = Arc<Mutex<BTreeMap<String, usize>>>;

/// What a write touched: `POST nodelocks`, `PATCH vgpuallocations/status`, ...
fn classify(method: &http::Method, path: &str) -> String {
    let parts: Vec<&str> = path
        .split('?')
        .next()
        .unwrap_or_default()
        .split('/')
        .collect();
    let resources = ["nodelocks", "vgpuallocations", "pods", "events", "bindings"];
    let resource = parts
        .iter()
        .rposition(|p| resources.contains(p))
        .map_or("other", |i| parts[i]);
    let subresource = match parts.last() {
        Some(&"status") => "/status",
        Some(&"binding") => "/binding",
        _ => "",
    };
    format!("{method} {resource}{subresource}")
}

async fn counting_client(plane: &ControlPlane, writes: Writes) -> Client {
    let config = plane.client_config().await.unwrap();
    let layer =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            if request.method() != http::Method::GET {
                let key = classify(request.method(), request.uri().path());
                *writes.lock().unwrap().entry(key).or_default() += 1;
            }
            request
        });
    ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build()
}

async fn burst(cluster: &Cluster, prefix: &str, limits: Value, annotations: Value) -> Duration {
    let started = Instant::now();
    for p in 0..PODS {
        cluster
            .create_pod(
                &format!("{prefix}-{p:03}"),
                limits.clone(),
                annotations.clone(),
            )
            .await;
    }
    eprintln!(
        "{prefix}: {PODS} created in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap();
        let bound = list
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count();
        if bound == PODS {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{prefix}: only {bound} of {PODS} bound"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    let writes = Writes::default();
    let counted = writes.clone();
    let cluster = Cluster::start_with(Config::default(), async move |plane: &ControlPlane| {
        counting_client(plane, counted).await
    })
    .await;
    spawn_allocate_stand_in(cluster.client.clone());
    for n in 0..NODES {
        cluster
            .add_gpu_node(
                &format!("bench-{n:02}"),
                "NVIDIA A100-SXM4-80GB",
                GPUS,
                81_920,
            )
            .await;
    }
    let rate = |d: Duration| PODS as f64 / d.as_secs_f64();

    let plain = burst(&cluster, "plain", json!({"cpu": "10m"}), json!({})).await;
    let gpu =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "10"});
    writes.lock().unwrap().clear();
    let binpack = burst(&cluster, "binpack", gpu.clone(), json!({})).await;
    let binpack_writes = std::mem::take(&mut *writes.lock().unwrap());
    let spread = burst(
        &cluster,
        "spread",
        gpu,
        json!({"hami.io/node-scheduler-policy": "spread"}),
    )
    .await;
    let spread_writes = std::mem::take(&mut *writes.lock().unwrap());

    println!(
        "Scheduling throughput: {PODS} pods per burst, {NODES} nodes x {GPUS} GPUs, real kube-scheduler"
    );
    println!(
        "{:<46} {:>8.1} s {:>8.1} pods/s",
        "plain pods (no GPU)",
        plain.as_secs_f64(),
        rate(plain)
    );
    println!(
        "{:<46} {:>8.1} s {:>8.1} pods/s  ({:.0}% of plain)",
        "GPU pods, node policy binpack (default)",
        binpack.as_secs_f64(),
        rate(binpack),
        100.0 * rate(binpack) / rate(plain)
    );
    println!(
        "{:<46} {:>8.1} s {:>8.1} pods/s  ({:.0}% of plain)",
        "GPU pods, node policy spread",
        spread.as_secs_f64(),
        rate(spread),
        100.0 * rate(spread) / rate(plain)
    );
    if std::env::var_os("DEBUG_APISERVER").is_some() {
        let text = cluster
            .client
            .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
            .await
            .unwrap();
        let mut lines: Vec<(f64, &str)> = text
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
            .filter_map(|l| Some((l.rsplit(' ').next()?.parse().ok()?, l)))
            .collect();
        lines.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (_, l) in lines.iter().take(30) {
            eprintln!("{l}");
        }
    }
    for line in cluster.metrics().await.lines() {
        if line.starts_with("tessera_extender_request_duration_seconds_sum")
            || line.starts_with("tessera_extender_request_duration_seconds_count")
            || line.starts_with("tessera_bind_lock_wait_duration_seconds_sum")
            || line.starts_with("tessera_bind_lock_wait_duration_seconds_count")
        {
            eprintln!("{line}");
        }
    }
    for (label, counts) in [("binpack", binpack_writes), ("spread", spread_writes)] {
        let total: usize = counts.values().sum();
        println!(
            "extender API writes per GPU pod ({label}): {:.2}  {counts:?}",
            total as f64 / PODS as f64
        );
    }
}
