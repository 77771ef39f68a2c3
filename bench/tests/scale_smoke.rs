//! `make bench-scale` in small, in `make test`: 100 kwok-simulated nodes × 8
//! GPUs with one background allocation per GPU, the real kube-scheduler and
//! the tessera-controller binary. Every measurement of the bench runs once
//! (smaller bursts), then bad input at scale:
//!
//! - a GpuNode with thousands of devices is refused by the CRD's schema
//!   with the field and the rule named; one at the 64-device limit is served;
//! - a VgpuAllocation naming a GPU its node does not report holds nothing and
//!   does not disturb the controller;
//! - pods deleted while a burst of pods is being bound;
//!
//! after which the controller's projection, folded from watch events, must
//! answer Filter exactly as a projection folded from a fresh list of the
//! API server does, for asks from 1 GiB to a whole GPU.

use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tessera_api::{
    testing::{allocation, container},
    v1alpha1::{AllocationPhase, DeviceSlice, NodeLock, VgpuAllocation},
};
use tessera_bench::{
    fleet::{self, Shape},
    measure,
    pods::{self, GpuAsk, NAMESPACE},
    report,
    rng::Rng,
    run::{Options, Running},
};
use tessera_controllers::{config::Config, extender::wire::ExtenderArgs, projection::Projection};
use tessera_e2e::artifacts::Artifacts;

const NODES: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hundred_simulated_nodes() {
    let options = Options {
        shape: Shape {
            nodes: NODES,
            gpus: 8,
            split: 10,
        },
        burst: 100,
        seed: 7,
        probe_calls: 20,
        burst_limit: Duration::from_secs(300),
        dir: None,
        cpu_profile_seconds: None,
    };
    let artifacts = Artifacts::locate().unwrap();
    let running = Running::start(options, &artifacts).await.unwrap();
    assert_eq!(running.background, NODES * 8);

    // Every measurement, once.
    let figures = running.measure().await.unwrap();
    eprintln!("{}", report::text(&figures));
    assert!(figures.gpu_rate > 0.0 && figures.plain_rate > 0.0);
    assert!(figures.idle.rss_mib > 0.0 && figures.cpu_ms_per_pod > 0.0);
    assert!(figures.http_ms.1 >= figures.http_ms.0 && figures.http_ms.0 > 0.0);
    assert!(figures.restart_bind_seconds > 0.0 && figures.restart_ready_seconds > 0.0);
    assert!(figures.lock_waits >= 100.0, "every Bind takes a NodeLock");
    // Bind writes: the lock (created on a node's first GPU pod, updated in
    // place after), the allocation and the binding; the lock is never
    // deleted when its holder is served.
    let per_pod = |request: &str| {
        figures
            .requests_per_gpu_pod
            .iter()
            .find(|(k, _)| k == request)
            .map_or(0.0, |(_, n)| *n)
    };
    let takes = per_pod("POST nodelocks") + per_pod("PUT nodelocks");
    assert!(
        (0.99..=1.1).contains(&takes),
        "one lock write per GPU pod (a retried Bind may add one): {:?}",
        figures.requests_per_gpu_pod
    );
    assert_eq!(per_pod("DELETE nodelocks"), 0.0);
    assert_eq!(per_pod("GET gpunodes"), 0.0);
    assert!(per_pod("POST pods/binding") >= 1.0);
    assert_eq!(
        report::row(&figures).split(',').count(),
        report::HEADER.split(',').count()
    );

    let client = running.client.clone();
    let pid = running.tessera.pid(&running.plane).unwrap();

    // A GpuNode of thousands of devices never reaches the controller.
    let huge = Shape {
        nodes: 1,
        gpus: 2048,
        split: 10,
    };
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["sim-huge", "sim-widest"] {
        nodes
            .create(&PostParams::default(), &fleet::node_object(name))
            .await
            .unwrap();
    }
    // 2,048 GPUs (without NVLink peers, which would pass the API server's
    // 3 MiB request limit first).
    let mut gpus = fleet::physical_gpus(NODES + 1, huge.gpus);
    gpus.iter_mut().for_each(|g| g.nvlink_peers.clear());
    let offer = fleet::offer("sim-huge", &gpus, huge.split);
    let refused = tessera_node_agent::publish::publish_once(&client, "sim-huge", &offer)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("status.devices") && refused.contains("at most 64 items"),
        "{refused}"
    );
    let widest = Shape {
        nodes: 1,
        gpus: 64,
        split: 10,
    };
    fleet::publish(&client, NODES + 2, "sim-widest", widest)
        .await
        .unwrap();

    // An allocation naming a GPU its node does not report.
    // (A plain pod: the webhook refuses GPU pods that name their node.)
    let mut phantom_pod = pods::pod("phantom", "phantom", None);
    phantom_pod.spec.as_mut().unwrap().node_name = Some(fleet::node_name(3));
    let phantom_pod = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &phantom_pod)
        .await
        .unwrap();
    let slice = DeviceSlice {
        mutex: false,
        family: Default::default(),
        template: None,
        uuid: "GPU-00000000-0000-0000-0000-00000000dead".into(),
        index: 99,
        model: fleet::MODEL.into(),
        memory_mib: 4096,
        cores: 10,
        mig: None,
        core_indexes: Vec::new(),
        sharing: None,
    };
    let phantom = allocation("phantom", &phantom_pod.uid().unwrap(), &fleet::node_name(3))
        .namespace(NAMESPACE)
        .container(container("main", vec![slice]))
        .build();
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), NAMESPACE);
    allocations
        .create(&PostParams::default(), &phantom)
        .await
        .unwrap();
    allocations
        .patch_status(
            "phantom",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": AllocationPhase::Allocated}})),
        )
        .await
        .unwrap();

    // Deletes during a burst of binds: every other pod goes as soon as it exists.
    let batch = running.gpu_pods("churn", 120, &mut Rng::new(11));
    let doomed: Vec<String> = batch.iter().step_by(2).map(|p| p.name_any()).collect();
    let kept: Vec<Pod> = batch.iter().skip(1).step_by(2).cloned().collect();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let create_all = pods::create_all(&client, batch);
    let delete_all = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stream::iter(&doomed)
            .for_each_concurrent(8, |name| {
                let pods_api = pods_api.clone();
                async move {
                    // Created or not yet: retry until it is gone.
                    for _ in 0..200 {
                        match pods_api.delete(name, &DeleteParams::default()).await {
                            Ok(_) => return,
                            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                    panic!("could not delete {name}");
                }
            })
            .await;
    };
    let (created, ()) = tokio::join!(create_all, delete_all);
    created.unwrap();
    // The kept half must all be bound; the others gone, holding nothing.
    let names: Vec<String> = kept.iter().map(|p| p.name_any()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let list = pods_api
            .list(&ListParams::default().labels("tessera.dev/bench-role=churn"))
            .await
            .unwrap();
        let bound = list
            .items
            .iter()
            .filter(|p| names.contains(&p.name_any()) && pods::node_of(p).is_some())
            .count();
        let doomed_left = list
            .items
            .iter()
            .filter(|p| doomed.contains(&p.name_any()))
            .count();
        if bound == names.len() && doomed_left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{bound} of {} kept pods bound, {doomed_left} deleted pods left",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    running
        .wait_settled(Duration::from_secs(120))
        .await
        .unwrap();
    let locks = Api::<NodeLock>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let existing = allocations
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let held: Vec<&NodeLock> = locks.iter().filter(|l| l.held_among(&existing)).collect();
    assert!(held.is_empty(), "NodeLocks held: {held:?}");
    // No live allocation for a deleted pod once things settle.
    wait_no_live_allocation_for(&allocations, &doomed).await;

    // The controller is still the process it was, and the fold agrees with
    // a fresh list of the API server, node by node and reason by reason.
    assert_eq!(running.tessera.pid(&running.plane), Some(pid));
    let fresh = Projection::spawn(client.clone());
    tokio::time::timeout(Duration::from_secs(60), fresh.wait_synced())
        .await
        .unwrap();
    let mut candidates = running.nodes.clone();
    candidates.push("sim-widest".into());
    for memory_gib in [1, 20, 60, 72, 79] {
        let ask = GpuAsk {
            memory_mib: memory_gib * 1024,
            cores: 30,
        };
        let pod = pods::as_scheduled(&pods::pod("fold-check", "fold-check", Some(ask)));
        let args = json!({"Pod": pod, "NodeNames": candidates});
        let (status, live) = measure::post_json(&running.metrics_addr(), "/filter", &args)
            .await
            .unwrap();
        assert_eq!(status, 200);
        let args: ExtenderArgs = serde_json::from_value(args).unwrap();
        let folded = tessera_controllers::extender::filter(&fresh, &Config::default(), &args);
        let folded = serde_json::to_value(folded).unwrap();
        assert_eq!(
            names_of(&live["NodeNames"]),
            names_of(&folded["NodeNames"]),
            "feasible nodes for {memory_gib} GiB"
        );
        assert_eq!(
            live["FailedNodes"], folded["FailedNodes"],
            "reasons for {memory_gib} GiB"
        );
        if memory_gib == 79 {
            // Only the nodes with an untouched GPU; sim-widest has 64.
            assert!(names_of(&live["NodeNames"]).contains(&"sim-widest".to_owned()));
        }
    }
    // Filter and Prioritize of every node, over HTTP, still answer.
    let probe = pods::as_scheduled(&pods::pod("probe", "probe", Some(bg_ask())));
    measure::filter_and_prioritize(&running.metrics_addr(), &probe, &candidates, 3)
        .await
        .unwrap();
}

fn bg_ask() -> GpuAsk {
    tessera_bench::occupancy::ASK
}

fn names_of(value: &Value) -> Vec<String> {
    let mut names: Vec<String> = value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

async fn wait_no_live_allocation_for(allocations: &Api<VgpuAllocation>, pods: &[String]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let list = allocations.list(&ListParams::default()).await.unwrap();
        let live: Vec<String> = list
            .items
            .iter()
            .filter(|a| pods.contains(&a.name_any()))
            .filter(|a| a.is_live())
            .map(|a| a.name_any())
            .collect();
        if live.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "allocations of deleted pods still live: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
