//! `tessera-demo`: Tessera on this machine (`make demo` / `make demo-down`).
//!
//! Starts a control plane (with kube-controller-manager, the default
//! kube-scheduler and kube-proxy) and four real nodes (containerd + kubelet)
//! with fake GPUs, one of them in dynamic MIG mode and one serving through
//! the DRA front door, imports the locally built images into the nodes and installs
//! Tessera with `helm install` from `charts/tessera`, as a user does: the node
//! agents run as a DaemonSet, kube-scheduler and tessera-controller as a
//! Deployment. Then it applies the examples in `examples/demo/`, prints a short
//! tour and leaves everything running.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tessera_api::v1alpha1::GpuNodeConfig;
use tessera_e2e::artifacts::Artifacts;
use tessera_e2e::cluster::{LocalCluster, NAMESPACE, NodeGpus};
use tessera_e2e::jaeger::{self, Jaeger};
use tessera_e2e::mock_vendor::{self, Vendor};
use tessera_e2e::node::{self, FakeGpu};
use tessera_e2e::prometheus::{Prometheus, Targets};
use tessera_e2e::{Lifetime, helm, kube_proxy, tools};

/// The demo's node in dynamic MIG mode.
const MIG_NODE: &str = "gpu-mig";
/// The demo's node behind the DRA front door.
const DRA_NODE: &str = "gpu-dra";
/// The node of Ascend NPUs, served by a mock of HAMi's Ascend device plugin.
const NPU_NODE: &str = "npu-ascend";

/// Where the demo's Prometheus address is written, under the demo's directory.
const PROMETHEUS_ADDR_FILE: &str = "prometheus/addr";
/// Where the demo's Jaeger query address is written, under the demo's directory.
const JAEGER_ADDR_FILE: &str = "jaeger/addr";
/// The demo pod whose trace the tour prints.
const TRACED_POD: &str = "share-a";

/// Runs Tessera with four real nodes of fake GPUs on this machine.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory for the demo's state, logs and kubeconfig.
    #[arg(
        long,
        env = "TESSERA_DEMO_DIR",
        default_value = ".tessera-demo",
        global = true
    )]
    dir: PathBuf,
    /// The example manifests to apply.
    #[arg(long, env = "TESSERA_DEMO_EXAMPLES", default_value = "examples/demo")]
    examples: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the demo (after removing any earlier one) and print the tour.
    Up,
    /// Stop the demo and remove its directory.
    Down,
    /// Write what the demo's Prometheus recorded of the node agents' HAMi
    /// series (`hami_vgpu_*`), their GPUs' health and slices held, and the
    /// controller's waiting GPU pods (`tessera_gpu_pod_waiting_seconds`)
    /// over the last minutes as promtool
    /// `input_series`, into the block between `# BEGIN recorded` and
    /// `# END recorded` of a `promtool test rules` file.
    Record {
        /// How many minutes back to read.
        #[arg(long, default_value_t = 8)]
        minutes: u64,
        /// The test file whose recorded block is replaced.
        #[arg(long, default_value = "e2e/prometheus/tuning_guide_test.yaml")]
        into: PathBuf,
    },
}

/// The demo's nodes: two models, GPUs on different NUMA nodes, an A100 in
/// MIG mode (the GpuNodeConfig `mig-pool` puts its node in dynamic MIG), an
/// L40S served through DRA claims (GpuNodeConfig `dra-pool`) and two Ascend
/// 910B4 NPUs served by a mock of HAMi's Ascend device plugin.
fn nodes() -> Vec<NodeGpus> {
    let mig = FakeGpu::many("mig", 1, "NVIDIA A100-SXM4-80GB", 81920, 1);
    vec![
        NodeGpus {
            name: "gpu-a100".into(),
            gpus: FakeGpu::many("a100", 2, "NVIDIA A100-SXM4-80GB", 81920, 1),
            ..Default::default()
        },
        NodeGpus {
            name: "gpu-h100".into(),
            gpus: FakeGpu::many("h100", 4, "NVIDIA H100 80GB HBM3", 81559, 2),
            ..Default::default()
        },
        NodeGpus {
            name: MIG_NODE.into(),
            mig: mig.iter().map(|g| g.uuid.clone()).collect(),
            gpus: mig,
            ..Default::default()
        },
        NodeGpus {
            name: DRA_NODE.into(),
            gpus: FakeGpu::many("l40s", 1, "NVIDIA L40S", 46068, 1),
            ..Default::default()
        },
        NodeGpus {
            name: NPU_NODE.into(),
            vendor: Some((
                Vendor::Ascend {
                    chip: "Ascend910B4".into(),
                },
                mock_vendor::ascend_910b4(2),
            )),
            ..Default::default()
        },
    ]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        dir,
        examples,
        command,
    } = Args::parse();
    let dir = std::path::absolute(&dir)?;
    match command {
        Command::Up => {
            down(&dir)?;
            up(&dir, &examples).await
        }
        Command::Down => {
            down(&dir)?;
            eprintln!("demo stopped; removed {}", dir.display());
            Ok(())
        }
        Command::Record { minutes, into } => record(&dir, minutes, &into).await,
    }
}

/// Replaces the recorded block of `into` with the last `minutes` of the
/// agents' HAMi series, one sample per scrape interval.
async fn record(dir: &Path, minutes: u64, into: &Path) -> anyhow::Result<()> {
    let addr_file = dir.join(PROMETHEUS_ADDR_FILE);
    let addr = std::fs::read_to_string(&addr_file)
        .with_context(|| format!("reading {} (is the demo up?)", addr_file.display()))?;
    let prometheus = Prometheus::at(addr.trim());
    let step = tessera_e2e::prometheus::SCRAPE_INTERVAL;
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let end = end - end % step.as_secs();
    let start = end - minutes * 60;
    let series = prometheus
        .query_range(
            r#"{__name__=~"hami_vgpu_.*|tessera_gpu_pod_waiting_seconds|tessera_gpu_slices_allocated|tessera_gpu_healthy"}"#,
            start,
            end,
            step,
        )
        .await?;
    anyhow::ensure!(
        !series.is_empty(),
        "the demo's Prometheus has no hami_vgpu_* series in the last {minutes} minutes"
    );
    let steps = usize::try_from((end - start) / step.as_secs() + 1)?;
    let block = tessera_e2e::prometheus::input_series(&series, start, steps, step);
    let text =
        std::fs::read_to_string(into).with_context(|| format!("reading {}", into.display()))?;
    let (head, rest) = text
        .split_once("# BEGIN recorded\n")
        .with_context(|| format!("{} has no `# BEGIN recorded` line", into.display()))?;
    let (_, tail) = rest
        .split_once("# END recorded")
        .with_context(|| format!("{} has no `# END recorded` line", into.display()))?;
    let indent = head.rsplit('\n').next().unwrap_or_default();
    std::fs::write(
        into,
        format!("{head}# BEGIN recorded\n{block}{indent}# END recorded{tail}"),
    )?;
    eprintln!(
        "wrote {} series × {steps} samples every {} s ({minutes} min) into {}",
        series.len(),
        step.as_secs(),
        into.display()
    );
    Ok(())
}

fn down(dir: &Path) -> anyhow::Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir.join("nodes")) {
        for entry in entries.flatten() {
            node::stop_detached(&entry.path())
                .with_context(|| format!("stopping node {}", entry.path().display()))?;
        }
    }
    kube_proxy::cleanup();
    tessera_e2e::stop_detached(dir).with_context(|| format!("stopping {}", dir.display()))?;
    Ok(())
}

async fn up(dir: &Path, examples: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let artifacts = Artifacts::locate()?;
    let nodes = nodes();
    for node in &nodes {
        match (&node.vendor, node.gpus.first()) {
            (Some((Vendor::Ascend { chip }, devices)), _) => step(&format!(
                "node {}: containerd, kubelet; {} × {chip} (a mock of HAMi's Ascend device plugin)",
                node.name,
                devices.len(),
            )),
            (Some((vendor, devices)), _) => step(&format!(
                "node {}: containerd, kubelet; {} × {vendor:?} (a mock vendor plugin)",
                node.name,
                devices.len(),
            )),
            (None, Some(gpu)) => step(&format!(
                "node {}: containerd, kubelet; {} × {}",
                node.name,
                node.gpus.len(),
                gpu.model
            )),
            (None, None) => step(&format!("node {}: containerd, kubelet", node.name)),
        }
    }
    step(
        "control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy v1.36), images, helm install tessera charts/tessera",
    );
    // What a GitOps repository would hold: a GpuNodeConfig for the MIG node
    // and one for the node behind the DRA door.
    let mig_pool: GpuNodeConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": "mig-pool"},
        "spec": {"nodeNames": [MIG_NODE], "operatingMode": "mig"},
    }))?;
    let dra_pool: GpuNodeConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": "dra-pool"},
        "spec": {"nodeNames": [DRA_NODE], "frontDoor": "dra"},
    }))?;
    // Ascend NPUs as HAMi's hami-scheduler-device configures them, and
    // traces to the demo's Jaeger (started once the plane runs; spans sent
    // before are dropped by the exporters, and no pod is scheduled before).
    let jaeger_ports = jaeger::Ports::choose(&tessera_e2e::host_ip()?)?;
    let mut values = mock_vendor::chart_values();
    values["otel"] = serde_json::json!({"endpoint": jaeger_ports.endpoint()});
    let cluster = LocalCluster::start_with_configs(
        Some(dir.to_owned()),
        Lifetime::Detached,
        &nodes,
        &artifacts,
        values,
        &[mig_pool, dra_pool],
    )
    .await
    .context("starting the cluster and installing Tessera")?;
    let plane = &cluster.plane;
    step("jaeger (OTLP from the controller and the node agents, in-memory)");
    let jaeger = Jaeger::start(plane, &jaeger_ports).await?;
    std::fs::write(dir.join(JAEGER_ADDR_FILE), jaeger.addr())?;
    step(&format!("examples from {}", examples.display()));
    let kubectl = |args: &[&str]| -> anyhow::Result<String> {
        let output = plane.kubectl()?.args(args).output()?;
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        Ok(text)
    };
    print!(
        "{}",
        kubectl(&["apply", "-f", &examples.display().to_string()])?
    );
    let client = plane.client().await?;
    wait_settled(&Api::namespaced(client, "default")).await;

    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    for tool in ["kubectl", "helm"] {
        let link = bin.join(tool);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(tools::binary(tool)?, &link)?;
    }
    let mut metrics = Vec::new();
    for node in nodes.iter().filter(|n| n.serves_nvidia()) {
        metrics.push((node.name.clone(), cluster.agent_metrics(&node.name).await?));
    }
    let mut helm_list = helm::command(Some(plane.kubeconfig()))?;
    helm_list.args(["list", "--namespace", NAMESPACE]);
    let releases = helm::run(&mut helm_list)?;
    step("prometheus (scraping the controller and the node agents)");
    let targets = Targets {
        agents: metrics.clone(),
        controllers: controller_endpoints(&Api::namespaced(plane.client().await?, NAMESPACE))
            .await?,
    };
    let prometheus = Prometheus::start(plane, &targets).await?;
    std::fs::write(dir.join(PROMETHEUS_ADDR_FILE), prometheus.addr())?;
    tour(&kubectl, &metrics, &releases)?;
    guide_query(
        &prometheus,
        targets.agents.len() + targets.controllers.len(),
    )
    .await?;
    pod_trace(&jaeger, &Api::namespaced(plane.client().await?, "default")).await?;
    cluster.detach()?;
    println!(
        "\nReady in {:.0} s. The cluster keeps running:\n\n  export KUBECONFIG={}\n  export PATH={}:$PATH   # kubectl and helm\n\nLogs: kubectl -n {NAMESPACE} logs …; {}/*.log, {}/nodes/*/*.log\nStop it with: make demo-down",
        started.elapsed().as_secs_f64(),
        dir.join("kubeconfig").display(),
        bin.display(),
        dir.display(),
        dir.display(),
    );
    Ok(())
}

/// The controller replicas' metrics endpoints, by pod.
async fn controller_endpoints(pods: &Api<Pod>) -> anyhow::Result<Vec<(String, String)>> {
    let list = pods.list(&Default::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .is_some_and(|s| s.containers.iter().any(|c| c.name == "controller"))
        })
        .filter_map(|p| {
            let ip = p.status?.pod_ip?;
            Some((p.metadata.name?, format!("{ip}:9395")))
        })
        .collect())
}

/// The tuning guide's memory query (§5.3), answered by the demo's
/// Prometheus once it has scraped every target.
async fn guide_query(prometheus: &Prometheus, targets: usize) -> anyhow::Result<()> {
    const QUERY: &str = "hami_vgpu_memory_used_bytes / hami_vgpu_memory_limit_bytes * 100";
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut samples = Vec::new();
    loop {
        if prometheus.targets_up().await? >= targets {
            samples = prometheus.query(QUERY).await?;
        }
        if !samples.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    println!(
        "\nPrometheus: http://{}   (scrapes every agent and the controller; the tuning guide's queries and alerts: docs/observability.md)",
        prometheus.addr()
    );
    println!("\n$ promql '{QUERY}'    # the tuning guide's memory use per container (§5.3)");
    samples.sort_by(|a, b| a.labels.get("pod").cmp(&b.labels.get("pod")));
    println!(
        "{:<12} {:<10} {:<26} {:>8}",
        "POD", "CONTAINER", "GPU", "USED %"
    );
    for sample in &samples {
        let label = |k: &str| sample.labels.get(k).map_or("", String::as_str);
        println!(
            "{:<12} {:<10} {:<26} {:>8.1}",
            label("pod"),
            label("container"),
            label("device_uuid"),
            sample.value
        );
    }
    if samples.is_empty() {
        println!(
            "(no answer yet: Prometheus has not scraped every target; ask it again in a minute)"
        );
    }
    Ok(())
}

/// The trace of [`TRACED_POD`]'s placement, read back from Jaeger's query
/// API and printed as a tree.
async fn pod_trace(jaeger: &Jaeger, pods: &Api<Pod>) -> anyhow::Result<()> {
    let uid = pods
        .get(TRACED_POD)
        .await?
        .metadata
        .uid
        .context("a pod without a UID")?;
    // The exporters send in batches (every 5 s) and Jaeger stores in
    // batches (every 1 s): the Allocate span is the last to arrive.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut trace = None;
    while Instant::now() < deadline {
        trace = jaeger.pod_trace(jaeger::CONTROLLER_SERVICE, &uid).await?;
        if trace
            .as_ref()
            .is_some_and(|t| !t.named("allocate").is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!(
        "\nJaeger: http://{}   (query API: /api/services, /api/traces?service={}&tags={{\"k8s.pod.uid\":\"…\"}}; built from its Go module, so its UI page is a placeholder)",
        jaeger.addr(),
        jaeger::CONTROLLER_SERVICE,
    );
    match trace {
        Some(trace) => {
            println!(
                "\n$ curl http://{}/api/traces/{}    # the placement of pod {TRACED_POD}, as a tree",
                jaeger.addr(),
                trace.id
            );
            print!("{}", trace.tree());
        }
        None => println!("(no trace of {TRACED_POD} in Jaeger yet; ask it again in a minute)"),
    }
    Ok(())
}

fn step(what: &str) {
    eprintln!("==> {what}");
}

/// Waits (60 s at most) until every pod runs or the scheduler said why not.
async fn wait_settled(pods: &Api<Pod>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Ok(list) = pods.list(&Default::default()).await else {
            break;
        };
        let settled = list.items.iter().all(|p| {
            let status = p.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref());
            let unschedulable = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter()
                    .any(|c| c.reason.as_deref() == Some("Unschedulable"))
            });
            phase == Some("Running") || unschedulable
        });
        if settled {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn tour(
    kubectl: &dyn Fn(&[&str]) -> anyhow::Result<String>,
    metrics: &[(String, String)],
    releases: &str,
) -> anyhow::Result<()> {
    let show = |title: &str, args: &[&str]| -> anyhow::Result<()> {
        println!("\n$ kubectl {}    # {title}", args.join(" "));
        print!("{}", kubectl(args)?);
        Ok(())
    };
    println!("\n$ helm list -n {NAMESPACE}    # Tessera, installed from charts/tessera");
    print!("{releases}");
    show(
        "Tessera's pods: kube-scheduler + controller, one agent per node",
        &["-n", NAMESPACE, "get", "pods", "-o", "wide"],
    )?;
    show("where each pod runs", &["get", "pods", "-o", "wide"])?;
    show(
        "what each pod holds: device, family, MiB, cores; dra-pod's claim too (CLAIM); ascend-vnpu's NPU beside the GPUs",
        &["get", "vgpuallocations"],
    )?;
    show(
        "the nodes' GPUs and the door each serves them through; npu-ascend's NPUs, read from its plugin's annotations",
        &["get", "gpunodes"],
    )?;
    show(
        "ascend-vnpu's NPU and vNPU template, as the Ascend plugin handed them over (3000 MiB rounded up to vir05_1c_8g)",
        &["logs", "ascend-vnpu"],
    )?;
    show(
        "gpu-dra's GPU as a DRA device (shareable; capacity memory, cores, slices)",
        &["get", "resourceslices"],
    )?;
    show(
        "dra-pod's claim, allocated by kube-scheduler's DynamicResources plugin",
        &["get", "resourceclaims"],
    )?;
    show(
        "dra-pod sees 8 GiB: its claim's limit, through CDI and the interposer",
        &["logs", "dra-pod"],
    )?;
    let events = [
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=no-fit,reason=FailedScheduling",
        "-o",
        "custom-columns=MESSAGE:.message",
    ];
    println!(
        "\n$ kubectl {}    # why no-fit stays Pending (the latest event)",
        events.join(" ")
    );
    let text = kubectl(&events)?;
    let mut lines = text.lines();
    println!("{}", lines.next().unwrap_or_default());
    println!("{}", lines.last().unwrap_or("(no event yet)"));
    show(
        "share-a's own view (cuDeviceTotalMem/cuMemGetInfo through the interposer)",
        &["logs", "share-a"],
    )?;
    show(
        "mig-pod sees the MIG instance made for it (dynamic MIG)",
        &["logs", "mig-pod"],
    )?;
    show(
        "the instance on gpu-mig's A100: profile, placement, holder",
        &[
            "get",
            "gpunode",
            MIG_NODE,
            "-o",
            "custom-columns=GPU:.status.devices[*].uuid,PROFILE:.status.devices[*].migInstances[*].profile,START:.status.devices[*].migInstances[*].placement.start,UUID:.status.devices[*].migInstances[*].uuid,HELD-BY:.status.devices[*].migInstances[*].heldBy",
        ],
    )?;
    println!("\nMetrics (Prometheus text, on the pod network):");
    for (node, addr) in metrics {
        println!(
            "  node agent of {node}: http://{addr}/metrics   (hami_vgpu_*, tessera_gpu_*, tessera_container_*)"
        );
    }
    println!(
        "  controller: kubectl -n {NAMESPACE} get endpoints tessera-controller (port 9395, /metrics)"
    );
    println!(
        "Dashboard: charts/tessera/files/dashboards/tessera.json, also in ConfigMap {NAMESPACE}/tessera-dashboard (label grafana_dashboard=1)"
    );
    println!(
        "Traces: one per GPU pod, from the webhook through Filter, Prioritize and Bind to the node agent's Allocate (chart value otel.endpoint; here the demo's Jaeger, below)."
    );
    println!(
        "Compute: share-a runs kernels under its 50 % limit (hami_vgpu_core_used_percent) and holds 37,500 of its 40,960 MiB, so the guide's HAMiGPUMemoryHigh alert fires after 5 minutes."
    );
    Ok(())
}
