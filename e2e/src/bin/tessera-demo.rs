//! `tessera-demo`: Tessera on this machine (`make demo` / `make demo-down`).
//!
//! Starts a control plane, Tessera's controller (extender, webhook, lifecycle
//! controllers) with kube-scheduler and kube-controller-manager, and two real
//! nodes (containerd + kubelet + node agent) with fake GPUs; applies the
//! examples in `examples/demo/`, prints a short tour and leaves everything
//! running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tessera_e2e::artifacts::Artifacts;
use tessera_e2e::node::{self, AgentMode, FakeGpu, NodeSpec, RealNode};
use tessera_e2e::stack::Tessera;
use tessera_e2e::{ControlPlane, Lifetime, Options, images, tools};

/// Runs Tessera with two real nodes of fake GPUs on this machine.
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
}

/// The demo's nodes: two models, GPUs on different NUMA nodes.
fn nodes() -> Vec<NodeSpec> {
    let labels = BTreeMap::from([("gpu".to_owned(), "on".to_owned())]);
    vec![
        NodeSpec {
            name: "gpu-a100".into(),
            gpus: FakeGpu::many("a100", 2, "NVIDIA A100-SXM4-80GB", 81920, 1),
            labels: labels.clone(),
            agent: AgentMode::Host,
        },
        NodeSpec {
            name: "gpu-h100".into(),
            gpus: FakeGpu::many("h100", 4, "NVIDIA H100 80GB HBM3", 81559, 2),
            labels,
            agent: AgentMode::Host,
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
    }
}

fn down(dir: &Path) -> anyhow::Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir.join("nodes")) {
        for entry in entries.flatten() {
            node::stop_detached(&entry.path())
                .with_context(|| format!("stopping node {}", entry.path().display()))?;
        }
    }
    tessera_e2e::stop_detached(dir).with_context(|| format!("stopping {}", dir.display()))?;
    Ok(())
}

async fn up(dir: &Path, examples: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let artifacts = Artifacts::locate()?;
    step("control plane (etcd, kube-apiserver v1.36)");
    let plane = ControlPlane::start_with(Options {
        dir: Some(dir.to_owned()),
        lifetime: Lifetime::Detached,
        install_crds: true,
        serve_pods: false,
    })
    .await
    .context("starting the control plane")?;
    step("images (sandbox, CUDA demo) from local files");
    let archives = images::build(&dir.join("images"), &artifacts)?;
    step("tessera-controller, kube-scheduler with the extender, kube-controller-manager");
    let tessera = Tessera::deploy(&plane, &artifacts).await?;
    let mut running = Vec::new();
    for spec in nodes() {
        step(&format!(
            "node {} (containerd, kubelet, node agent; {} × {})",
            spec.name,
            spec.gpus.len(),
            spec.gpus[0].model
        ));
        running.push(RealNode::start(&plane, &spec, &artifacts, &archives).await?);
    }
    let metrics: Vec<(String, u16)> = running
        .iter()
        .map(|n| (n.name().to_owned(), n.metrics_port()))
        .collect();
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
    let link = bin.join("kubectl");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(tools::binary("kubectl")?, &link)?;

    tour(&kubectl, &metrics, tessera.extender_port)?;
    for node in running {
        node.detach()?;
    }
    plane.detach()?;
    println!(
        "\nReady in {:.0} s. The cluster keeps running:\n\n  export KUBECONFIG={}\n  export PATH={}:$PATH   # kubectl v1.36\n\nLogs: {}/*.log, {}/nodes/*/*.log\nStop it with: make demo-down",
        started.elapsed().as_secs_f64(),
        dir.join("kubeconfig").display(),
        bin.display(),
        dir.display(),
        dir.display(),
    );
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
    metrics: &[(String, u16)],
    extender_port: u16,
) -> anyhow::Result<()> {
    let show = |title: &str, args: &[&str]| -> anyhow::Result<()> {
        println!("\n$ kubectl {}    # {title}", args.join(" "));
        print!("{}", kubectl(args)?);
        Ok(())
    };
    show("where each pod runs", &["get", "pods", "-o", "wide"])?;
    show(
        "what each pod holds: device, MiB, cores",
        &["get", "vgpuallocations"],
    )?;
    show("the nodes' GPUs", &["get", "gpunodes"])?;
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
    println!("\nMetrics (Prometheus text):");
    for (node, port) in metrics {
        println!(
            "  node agent of {node}: http://127.0.0.1:{port}/metrics   (hami_vgpu_*, tessera_gpu_*, tessera_container_*)"
        );
    }
    println!("  scheduler extender:      http://127.0.0.1:{extender_port}/metrics");
    println!(
        "Traces: every Bind and Allocate is a span; run `OTEL_EXPORTER_OTLP_ENDPOINT=http://<collector>:4317 make demo` to export them over OTLP."
    );
    Ok(())
}
