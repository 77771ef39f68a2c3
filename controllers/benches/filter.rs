//! Filter latency over every candidate of a synthetic 5,000-node × 8-GPU
//! cluster at about 50% occupancy with 40,000 live allocations; then the
//! same with a ResourceQuota on the namespace's GPU memory: with room (the
//! most the pod could count fits), and near its limit (every feasible node
//! is placed to count the pod exactly). Then the device-aware preemption
//! decision for a pod no node can take as it is.
//!
//! `cargo bench -p tessera-controllers --bench filter` (or `make bench`).
//! Prints p50/p99/max of: the filter decision alone, and the whole handler
//! path (JSON in, decision, JSON out) as kube-scheduler exercises it. Then
//! the same for other vendors' pods on 5,000 vendor nodes (half Ascend 910
//! with NetworkIDs, half Kunlunxin whole XPUs, half their devices held):
//! Filter, and Prioritize, which for these pods places the pod on every
//! node to score its topology.
//!
//! Then Filter over 1,000 nodes for a pod whose type and UUID lists are as
//! long as the parse allows (review finding H2: 32 entries of 128 bytes in
//! each of the four NVIDIA lists), none of them matching, so every device
//! scans every entry; `-- lists` runs only that part.
//!
//! And the wire: Filter then Prioritize through the extender's own router
//! (axum: body, JSON decoding, decision, JSON encoding; no TCP), naming every
//! node and naming the 500 kube-scheduler sends at 5,000 nodes by default,
//! with the share of each call spent decoding and encoding.

#![allow(missing_docs)]

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use serde_json::json;
use tessera_api::v1alpha1::{DeviceFamily, OperatingMode, SchedulingPolicy};
use tessera_controllers::{
    config::Config,
    engine::GpuDevice,
    extender::{filter, prioritize, victims as preempt, wire::ExtenderArgs},
    projection::{AllocationKey, LiveAllocation, Projection, UuidSlice},
};
use tessera_scheduling::request::parse_pod;

const NODES: usize = 5_000;
const GPUS: usize = 8;
const ALLOCATIONS: usize = 40_000;
const ROUNDS: usize = 300;

/// A small deterministic generator (xorshift), so every run builds the same cluster.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Node `n`'s GPUS A100s of 80 GiB, two NUMA nodes of four.
fn a100s(n: usize) -> Vec<GpuDevice> {
    (0..GPUS)
        .map(|g| GpuDevice {
            cordoned: false,
            family: Default::default(),
            network_id: None,
            uuid: format!("GPU-{n:05}-{g}"),
            index: g as u32,
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81_920,
            cores: 100,
            split_count: 10,
            numa_node: Some((g / 4) as u32),
            healthy: true,
            mode: OperatingMode::HamiCore,
            mig: None,
            mig_present: 0,
            profiles: Vec::new(),
            minor: None,
            qos_policy: None,
        })
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "lists") {
        lists();
        return;
    }
    let (projection, feeder) = Projection::new();
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    {
        let mut ledger = feeder.write();
        for n in 0..NODES {
            ledger.set_node(&format!("node-{n:05}"), a100s(n));
        }
        // One allocation per GPU on average, sized 20-80% so occupancy averages 50%.
        for a in 0..ALLOCATIONS {
            let node = (rng.next() as usize) % NODES;
            let gpu = (rng.next() as usize) % GPUS;
            let percent = 20 + rng.next() % 61;
            ledger.insert_allocation(
                AllocationKey {
                    namespace: "bench".into(),
                    name: format!("pod-{a}"),
                },
                LiveAllocation {
                    quota: [("nvidia.com/gpumem".to_owned(), 81_920 * percent / 100)].into(),
                    pod_uid: format!("uid-{a}"),
                    // Priorities 0-7 by position: preemption's candidates.
                    priority: Some((a % 8) as i32),
                    nominated: false,
                    node: format!("node-{node:05}"),
                    slices: vec![UuidSlice {
                        mutex: false,
                        uuid: format!("GPU-{node:05}-{gpu}"),
                        memory_mib: 81_920 * percent / 100,
                        cores: percent as u32,
                        mig: None,
                        core_indexes: Vec::new(),
                        units: 1,
                        sharing: None,
                    }],
                },
            );
        }
    }
    feeder.mark_all_synced();
    let args_json = json!({
        "Pod": {"metadata": {"name": "p", "namespace": "bench"},
                "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "30"}}}]}},
        "Nodes": null,
        "NodeNames": (0..NODES).map(|n| format!("node-{n:05}")).collect::<Vec<_>>(),
    });
    let body = serde_json::to_vec(&args_json).unwrap();
    let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
    let config = Config::default();

    let mut decision = Vec::with_capacity(ROUNDS);
    let mut handler = Vec::with_capacity(ROUNDS);
    let mut feasible = 0;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let result = filter(&projection, &config, &args);
        decision.push(started.elapsed());
        feasible = result.node_names.as_ref().map_or(0, Vec::len);

        let started = Instant::now();
        let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
        let result = filter(&projection, &config, &args);
        let out = serde_json::to_vec(&result).unwrap();
        handler.push(started.elapsed());
        std::hint::black_box(out);
    }
    println!(
        "Filter over {NODES} candidate nodes x {GPUS} GPUs, {ALLOCATIONS} live allocations, {ROUNDS} rounds"
    );
    println!("feasible nodes for a 30000 MiB / 30-core request: {feasible}");
    report("decision (filter fn)", &mut decision);
    report("handler (JSON in, decision, JSON out)", &mut handler);

    // A GPU memory quota with room, then one 50,000 MiB from full: more
    // than the pod's 30,000 but less than a whole GPU, so every feasible
    // node is placed to count the pod exactly.
    let used = projection.read().namespace_used("bench")["nvidia.com/gpumem"];
    let quotas = [
        ("gpu", "10Ti".to_owned(), "with room"),
        ("tight", (used + 50_000).to_string(), "near its limit"),
    ];
    for (name, hard, what) in quotas {
        let quota: k8s_openapi::api::core::v1::ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": hard}},
        }))
        .unwrap();
        feeder.quota_event(kube::runtime::watcher::Event::Apply(quota), &mut Vec::new());
        let mut timings = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let result = filter(&projection, &config, &args);
            timings.push(started.elapsed());
            assert_eq!(result.node_names.as_ref().map_or(0, Vec::len), feasible);
        }
        report(&format!("decision, GPU memory quota {what}"), &mut timings);
    }
    preemption(&projection);
    wire(&projection);
    vendors(&mut rng);
    lists();
}

/// Filter over 1,000 idle 8-GPU nodes for pods with the longest type and
/// UUID lists the parse accepts (H2), none matching a device: once with a
/// use-gputype list (every device scans all 32 entries and is refused, so
/// every node is explained), once with only exclusions (every device scans
/// them all and every node fits). And the list before the bound: refused
/// at parse, naming the annotation.
fn lists() {
    use tessera_api::names::annotations as keys;
    use tessera_scheduling::request::{MAX_LIST_ENTRIES, MAX_LIST_ENTRY_BYTES, RequestConfig};
    const LIST_NODES: usize = 1_000;
    let (projection, feeder) = Projection::new();
    {
        let mut ledger = feeder.write();
        for n in 0..LIST_NODES {
            ledger.set_node(&format!("node-{n:05}"), a100s(n));
        }
    }
    feeder.mark_all_synced();
    // Entries of the longest length, differing only at the end: every
    // substring search runs as far as it can.
    let list = |prefix: char| {
        (0..MAX_LIST_ENTRIES)
            .map(|i| {
                format!(
                    "{}{i:04}",
                    prefix.to_string().repeat(MAX_LIST_ENTRY_BYTES - 4)
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let pod = |annotations: serde_json::Value| {
        json!({
            "Pod": {"metadata": {"name": "p", "namespace": "bench", "annotations": annotations},
                    "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "30"}}}]}},
            "Nodes": null,
            "NodeNames": (0..LIST_NODES).map(|n| format!("node-{n:05}")).collect::<Vec<_>>(),
        })
    };
    let config = Config::default();
    let cases = [
        (
            "use-gputype matches nothing",
            pod(json!({
                keys::USE_GPU_TYPE: list('a'),
                keys::NOUSE_GPU_TYPE: list('n'),
                keys::USE_GPU_UUID: list('G'),
                keys::NOUSE_GPU_UUID: list('X'),
            })),
            0,
        ),
        (
            "exclusions only, every node fits",
            pod(json!({
                keys::NOUSE_GPU_TYPE: list('n'),
                keys::NOUSE_GPU_UUID: list('X'),
            })),
            LIST_NODES,
        ),
    ];
    println!(
        "Filter over {LIST_NODES} nodes x {GPUS} GPUs, lists of {MAX_LIST_ENTRIES} entries of {MAX_LIST_ENTRY_BYTES} bytes, {ROUNDS} rounds"
    );
    for (what, args, want) in cases {
        let args: ExtenderArgs = serde_json::from_value(args).unwrap();
        let mut timings = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let result = filter(&projection, &config, &args);
            timings.push(started.elapsed());
            assert_eq!(
                result.node_names.as_ref().map_or(0, Vec::len),
                want,
                "{what}"
            );
        }
        report(&format!("decision, {what}"), &mut timings);
    }
    // What H2's trigger wrote (about 120,000 entries) no longer parses.
    let hostile: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": {keys::USE_GPU_TYPE: "zz,".repeat(120_000)}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    let started = Instant::now();
    let refused = parse_pod(&hostile, &RequestConfig::default()).unwrap_err();
    println!(
        "a 120,000-entry list: refused at parse in {:.3} ms: {refused}",
        started.elapsed().as_secs_f64() * 1e3
    );
}

/// Filter then Prioritize through the extender's router, as kube-scheduler
/// calls them: the pod and `names` in, the feasible names out, the same pod
/// and those names in, the scores out. Per call, how much of it is JSON.
fn wire(projection: &Projection) {
    use tessera_controllers::extender::{
        Extender, ExtenderMetrics,
        wire::{ExtenderFilterResult, HostPriority},
    };
    use tower::ServiceExt;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    // Nothing here reaches an API server: Filter and Prioritize only read the ledger.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let metrics = ExtenderMetrics::register(&mut prometheus_client::registry::Registry::default());
    let config = std::sync::Arc::new(Config::default());
    let router = Extender::new(client, projection.clone(), config, metrics).router();
    // A namespace without the quotas the section above put on "bench".
    let pod = json!({"metadata": {"name": "p", "namespace": "wire", "uid": "u"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "30"}}}]}});
    let post = |path: &str, body: Vec<u8>| {
        let request = http::Request::post(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let router = router.clone();
        runtime.block_on(async move {
            let answer = router.oneshot(request).await.unwrap();
            assert_eq!(answer.status(), 200);
            axum::body::to_bytes(answer.into_body(), usize::MAX)
                .await
                .unwrap()
        })
    };
    for sent in [NODES, 500] {
        let names: Vec<String> = (0..sent).map(|n| format!("node-{n:05}")).collect();
        let filter_body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": names})).unwrap();
        let (mut filters, mut prioritizes, mut json_only) = (Vec::new(), Vec::new(), Vec::new());
        let mut sizes = (0, 0, 0);
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let answer = post("/filter", filter_body.clone());
            filters.push(started.elapsed());
            let result: ExtenderFilterResult = serde_json::from_slice(&answer).unwrap();
            let feasible = result.node_names.unwrap_or_default();
            let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": feasible})).unwrap();
            let started = Instant::now();
            let scores = post("/prioritize", body.clone());
            prioritizes.push(started.elapsed());
            sizes = (filter_body.len() + answer.len(), body.len(), scores.len());
            // The extender's JSON alone: both requests decoded, both answers encoded.
            let started = Instant::now();
            let args: ExtenderArgs = serde_json::from_slice(&filter_body).unwrap();
            let filtered: ExtenderFilterResult = serde_json::from_slice(&answer).unwrap();
            std::hint::black_box(serde_json::to_vec(&filtered).unwrap());
            let args2: ExtenderArgs = serde_json::from_slice(&body).unwrap();
            let scored: Vec<HostPriority> = serde_json::from_slice(&scores).unwrap();
            std::hint::black_box(serde_json::to_vec(&scored).unwrap());
            json_only.push(started.elapsed());
            std::hint::black_box((args, args2));
        }
        println!(
            "Filter then Prioritize through the extender's router, {sent} names sent (bodies in+out: Filter {} KB, Prioritize {} + {} KB)",
            sizes.0 / 1000,
            sizes.1 / 1000,
            sizes.2 / 1000
        );
        report("  Filter (router: JSON, decision)", &mut filters);
        report("  Prioritize (router: JSON, decision)", &mut prioritizes);
        report("  of both, the extender's JSON", &mut json_only);
    }
}

/// The preemption decision over every node for a pod of priority 8 asking
/// 4 whole GPUs, as the extender takes it from the ledger: per node, the
/// pods (priority 0-7) whose release lets it fit, then the cheapest node.
fn preemption(projection: &Projection) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "urgent", "namespace": "bench"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
    }))
    .unwrap();
    let request = parse_pod(&pod, &Config::default().request)
        .unwrap()
        .unwrap();
    let policy = SchedulingPolicy::Spread;
    const PREEMPT_ROUNDS: usize = 20;
    let names: Vec<String> = (0..NODES).map(|n| format!("node-{n:05}")).collect();
    let decide = |sampled: bool, start: usize| {
        if sampled {
            preempt::plan_sampled(
                projection,
                &request,
                policy,
                8,
                (&names, start),
                &HashSet::new(),
            )
        } else {
            preempt::plan(
                &projection.read(),
                &request,
                policy,
                8,
                names.iter().map(String::as_str),
                &HashSet::new(),
            )
        }
    };
    println!(
        "Preemption, 4 whole GPUs at priority 8 over {NODES} nodes ({} freeable nodes are enough):",
        preempt::enough_candidates(NODES)
    );
    for (what, sampled) in [
        ("  as the extender decides (sampled, batches of 256)", true),
        ("  every node, then the best", false),
    ] {
        let mut timings = Vec::with_capacity(PREEMPT_ROUNDS);
        let mut summary = String::new();
        for round in 0..PREEMPT_ROUNDS {
            let started = Instant::now();
            // A different starting node each round, as different pods have.
            let chosen = decide(sampled, round * 997 % NODES);
            timings.push(started.elapsed());
            let chosen = chosen.expect("some node can be freed");
            summary = format!(
                "last round: {} by {} victims of priority <= {}",
                chosen.node,
                chosen.victims.len(),
                chosen.choice.highest_priority
            );
        }
        println!("{what}: {summary}");
        report("    decision", &mut timings);
    }
}

/// Filter and Prioritize for an Ascend 910 pod (2 NPUs) and a Kunlunxin
/// pod (2 whole XPUs) over 5,000 vendor nodes.
fn vendors(rng: &mut Rng) {
    let (projection, feeder) = Projection::new();
    {
        let mut ledger = feeder.write();
        let mut a = 0;
        for n in 0..NODES {
            let ascend = n % 2 == 0;
            let devices: Vec<GpuDevice> = (0..GPUS)
                .map(|g| GpuDevice {
                    cordoned: false,
                    family: if ascend {
                        DeviceFamily::Ascend
                    } else {
                        DeviceFamily::Kunlunxin
                    },
                    network_id: ascend.then_some((g / 4) as u32),
                    uuid: format!("DEV-{n:05}-{g}"),
                    index: g as u32,
                    model: if ascend { "Ascend910A" } else { "kunlun" }.into(),
                    memory_mib: if ascend { 32_768 } else { 98_304 },
                    cores: 100,
                    split_count: if ascend { 4 } else { 1 },
                    numa_node: None,
                    healthy: true,
                    mode: OperatingMode::HamiCore,
                    mig: None,
                    mig_present: 0,
                    profiles: Vec::new(),
                    minor: None,
                    qos_policy: None,
                })
                .collect();
            for device in &devices {
                // Half the devices held whole.
                if rng.next().is_multiple_of(2) {
                    a += 1;
                    ledger.insert_allocation(
                        AllocationKey {
                            namespace: "bench".into(),
                            name: format!("vendor-pod-{a}"),
                        },
                        LiveAllocation {
                            quota: Default::default(),
                            pod_uid: format!("vendor-uid-{a}"),
                            priority: None,
                            nominated: false,
                            node: format!("node-{n:05}"),
                            slices: vec![UuidSlice {
                                mutex: false,
                                uuid: device.uuid.clone(),
                                memory_mib: device.memory_mib,
                                cores: 100,
                                mig: None,
                                core_indexes: Vec::new(),
                                units: 1,
                                sharing: None,
                            }],
                        },
                    );
                }
            }
            ledger.set_node(&format!("node-{n:05}"), devices);
        }
    }
    feeder.mark_all_synced();
    let config = Config {
        request: tessera_scheduling::request::vendor_config(),
        ..Config::default()
    };
    for (what, limits) in [
        ("Ascend 910, 2 NPUs", json!({"huawei.com/Ascend910A": "2"})),
        ("Kunlunxin, 2 whole XPUs", json!({"kunlunxin.com/xpu": "2"})),
    ] {
        let args: ExtenderArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"name": "p", "namespace": "bench"},
                    "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}},
            "Nodes": null,
            "NodeNames": (0..NODES).map(|n| format!("node-{n:05}")).collect::<Vec<_>>(),
        }))
        .unwrap();
        let mut filtering = Vec::with_capacity(ROUNDS);
        let mut scoring = Vec::with_capacity(ROUNDS);
        let mut feasible = 0;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let result = filter(&projection, &config, &args);
            filtering.push(started.elapsed());
            feasible = result.node_names.as_ref().map_or(0, Vec::len);
            let started = Instant::now();
            let scores = prioritize(&projection, &config, &args, |_| false);
            scoring.push(started.elapsed());
            std::hint::black_box(scores);
        }
        println!("{what}: {feasible} of {NODES} nodes feasible");
        report("  Filter (decision)", &mut filtering);
        report(
            "  Prioritize (topology placed on every candidate)",
            &mut scoring,
        );
    }
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{what:<40} p50 {:>8.3} ms   p99 {:>8.3} ms   max {:>8.3} ms",
        at(0.50).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3
    );
}
