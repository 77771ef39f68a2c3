//! The `tessera-node-agent` process: flags and wiring.

use std::{path::PathBuf, sync::Arc, time::Duration};

use clap::{ArgAction, Parser, ValueEnum};
use tessera_api::v1alpha1::{GpuNode, NodeLock, NodeSettings};

use crate::{
    Error,
    backend::{self, Backend, FakeBackend, NvmlBackend},
    install, inventory,
    lease::{self, LeaseSite},
    mps::{FakeControl, MpsControl, MpsManager, NvidiaControl},
    plugin::{
        self, CONTAINER_LIBRARY, DEFAULT_CDI_ANNOTATION_PREFIX, DEFAULT_CDI_KIND, DeviceList,
        DeviceListStrategy, Endpoint, HostPaths, PluginState, Service, parse_cdi_annotation_prefix,
        parse_cdi_kind,
    },
    publish,
    supervise::{self, Loops},
    view::NodeView,
};

/// Where the agent reads the node's GPUs from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// NVML (`libnvidia-ml.so.1`): real GPUs.
    Nvml,
    /// A YAML file describing fake GPUs (`--fake-gpus-file`).
    Fake,
}

/// Tessera's node agent: publishes the node's GPUs as a GpuNode, serves the
/// kubelet's device-plugin calls, and hands each container its GPU slice.
#[derive(Parser, Debug, Clone)]
#[command(name = "tessera-node-agent", version, about)]
pub struct Args {
    /// Kubeconfig to use; without it, the in-cluster service account (or
    /// the usual KUBECONFIG lookup).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (in a DaemonSet: from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Where the GPUs come from.
    #[arg(long, env = "TESSERA_GPU_BACKEND", value_enum, default_value = "nvml")]
    pub backend: BackendKind,
    /// The fake GPUs (YAML), with `--backend fake`; re-read every poll.
    #[arg(
        long,
        env = "TESSERA_FAKE_GPUS_FILE",
        required_if_eq("backend", "fake")
    )]
    pub fake_gpus_file: Option<PathBuf>,
    /// How often the GPUs (health included) are read, in milliseconds.
    #[arg(long, env = "TESSERA_GPU_POLL_MILLIS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub gpu_poll_millis: u64,
    /// Cluster defaults for this node's settings (YAML, NodeSettings keys);
    /// GpuNodeConfigs override them. See docs/configuration.md.
    #[arg(long, env = "TESSERA_NODE_DEFAULTS")]
    pub defaults: Option<PathBuf>,
    /// The kubelet's device-plugin directory.
    #[arg(long, env = "TESSERA_DEVICE_PLUGIN_DIR", default_value = tessera_deviceplugin::DEVICE_PLUGIN_PATH)]
    pub device_plugin_dir: PathBuf,
    /// The kubelet's plugins directory: the DRA plugin listens on
    /// `<dir>/gpu.tessera.dev/dra.sock` (the kubelet's `<root-dir>/plugins`).
    #[arg(
        long,
        env = "TESSERA_KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    pub kubelet_plugins_dir: PathBuf,
    /// The kubelet's plugin registry, where the DRA plugin's registration
    /// socket goes (the kubelet's `<root-dir>/plugins_registry`).
    #[arg(long, env = "TESSERA_PLUGINS_REGISTRY_DIR", default_value = tessera_draplugin::PLUGINS_REGISTRY)]
    pub plugins_registry_dir: PathBuf,
    /// The directory of CDI specs the container runtime reads (containerd's
    /// `cdi_spec_dirs`); prepared DRA claims get one spec file each here.
    #[arg(long, env = "TESSERA_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// The extended resource the plugin registers.
    #[arg(long, env = "TESSERA_RESOURCE_NAME", default_value = tessera_api::names::resources::GPU)]
    pub resource_name: String,
    /// The interposer library on the host, mounted into GPU containers.
    #[arg(
        long,
        env = "TESSERA_INTERPOSER_LIBRARY",
        default_value = "/usr/local/vgpu/libtessera_vgpu.so"
    )]
    pub interposer_library: PathBuf,
    /// At start-up, before registering with the kubelet, copy this file
    /// (the interposer in the agent's image) to `--interposer-library`:
    /// atomically, and only when the contents differ.
    #[arg(long, env = "TESSERA_INSTALL_INTERPOSER_FROM")]
    pub install_interposer_from: Option<PathBuf>,
    /// How Allocate passes the devices to the container runtime, a comma
    /// list (NVIDIA's DEVICE_LIST_STRATEGY): `envvar`
    /// (NVIDIA_VISIBLE_DEVICES, NVIDIA container runtime), `cdi-cri` (CDI
    /// device names in the CRI request), `cdi-annotations` (CDI names in a
    /// container annotation).
    #[arg(
        long,
        env = "TESSERA_DEVICE_LIST_STRATEGY",
        value_enum,
        value_delimiter = ',',
        default_value = "envvar"
    )]
    pub device_list_strategy: Vec<DeviceListStrategy>,
    /// The CDI kind (`vendor/class`) of the GPUs in the node's CDI specs;
    /// `nvidia-ctk cdi generate` writes `nvidia.com/gpu`.
    #[arg(long, env = "TESSERA_CDI_KIND", default_value = DEFAULT_CDI_KIND, value_parser = parse_cdi_kind)]
    pub cdi_kind: String,
    /// The prefix of the CDI annotation's key with `cdi-annotations`
    /// (NVIDIA's `--cdi-annotation-prefix`).
    #[arg(long, env = "TESSERA_CDI_ANNOTATION_PREFIX", default_value = DEFAULT_CDI_ANNOTATION_PREFIX, value_parser = parse_cdi_annotation_prefix)]
    pub cdi_annotation_prefix: String,
    /// The agent's directory on the host: the preload list and one shared
    /// region directory per GPU container live here.
    #[arg(long, env = "TESSERA_STATE_DIR", default_value = "/var/lib/tessera")]
    pub state_dir: PathBuf,
    /// Namespace of the agent's liveness Lease (`tessera-agent-<node>`).
    #[arg(
        long,
        env = "TESSERA_LEASE_NAMESPACE",
        default_value = "kube-node-lease"
    )]
    pub lease_namespace: String,
    /// The agent's pod name (in a DaemonSet: from the downward API). With
    /// `--pod-namespace` equal to `--lease-namespace` and `--pod-uid`, the
    /// pod owns the Lease, so it goes with the pod even when the agent
    /// cannot delete it (helm uninstall removes the agent's RBAC first).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The agent's pod namespace (downward API `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// The agent's pod UID (downward API `metadata.uid`).
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// Address of the Prometheus `/metrics` endpoint (HAMi's monitor port).
    #[arg(long, env = "TESSERA_METRICS_ADDR", default_value = "0.0.0.0:9394")]
    pub metrics_addr: std::net::SocketAddr,
    /// Also export HAMi's metric names from before v2.9
    /// (`HostGPUMemoryUsage`, `vGPU_device_memory_usage_in_bytes`, ...) with
    /// their labels, beside v2.9's (HAMi's `--legacy-metrics`).
    #[arg(
        long,
        env = "TESSERA_LEGACY_METRICS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = ArgAction::Set
    )]
    pub legacy_metrics: bool,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "TESSERA_LOG", default_value = "info")]
    pub log: String,
    /// On SIGTERM, how long to wait for a pod already bound here to be
    /// served (its NodeLock to go) after marking the GpuNode not Ready, in
    /// seconds; keep it under the pod's termination grace period.
    #[arg(long, env = "TESSERA_DRAIN_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=300))]
    pub drain_seconds: u64,
    /// NVIDIA's MPS control program, which the agent runs once per GPU in
    /// `operatingMode: mps` (with `--backend fake`, a fake daemon in the
    /// agent stands in for it).
    #[arg(
        long,
        env = "TESSERA_MPS_CONTROL",
        default_value = "nvidia-cuda-mps-control"
    )]
    pub mps_control: PathBuf,
}

impl Args {
    /// The agent's Lease and its owner, from the flags.
    pub fn lease_site(&self) -> LeaseSite {
        let pod = lease::pod_owner(
            self.pod_name.as_deref(),
            self.pod_namespace.as_deref(),
            self.pod_uid.as_deref(),
            &self.lease_namespace,
        );
        if pod.is_none() && self.pod_namespace.is_some() {
            tracing::info!(
                lease_namespace = %self.lease_namespace,
                pod_namespace = self.pod_namespace.as_deref().unwrap_or_default(),
                "the agent Lease is owned by the Node, not the agent pod (another namespace, or no pod UID): an agent that cannot delete it on stop leaves it until the Node goes"
            );
        }
        LeaseSite {
            namespace: self.lease_namespace.clone(),
            node: self.node_name.clone(),
            pod,
        }
    }

    /// How Allocate passes the devices on, from the flags.
    pub fn device_list(&self) -> DeviceList {
        let mut strategies = self.device_list_strategy.clone();
        strategies.sort();
        strategies.dedup();
        DeviceList {
            strategies,
            cdi_kind: self.cdi_kind.clone(),
            cdi_annotation_prefix: self.cdi_annotation_prefix.clone(),
        }
    }

    /// Reads `--defaults`, or HAMi's defaults without it.
    pub fn load_defaults(&self) -> Result<NodeSettings, Error> {
        let Some(path) = &self.defaults else {
            return Ok(NodeSettings::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        parse_defaults(&text)
            .map_err(|message| Error::Config(format!("{}: {message}", path.display())))
    }
}

/// Parses node defaults: any subset of the NodeSettings keys over HAMi's defaults.
pub fn parse_defaults(text: &str) -> Result<NodeSettings, String> {
    let mut merged = serde_json::to_value(NodeSettings::default()).map_err(|e| e.to_string())?;
    let given: serde_json::Map<String, serde_json::Value> = match serde_yaml_ng::from_str(text) {
        Ok(serde_json::Value::Object(map)) => map,
        Ok(serde_json::Value::Null) => serde_json::Map::new(),
        Ok(_) => return Err("must be a mapping of settings".into()),
        Err(e) => return Err(e.to_string()),
    };
    for (key, value) in given {
        let Some(slot) = merged.get_mut(&key) else {
            return Err(format!("{key}: unknown setting"));
        };
        *slot = value;
    }
    let settings: NodeSettings = serde_json::from_value(merged).map_err(|e| e.to_string())?;
    if !(1..=100).contains(&settings.device_split_count) {
        return Err("deviceSplitCount: must be between 1 and 100".into());
    }
    for (key, value) in [
        ("deviceMemoryScaling", settings.device_memory_scaling),
        ("deviceCoreScaling", settings.device_core_scaling),
    ] {
        if !(value > 0.0 && value <= 100.0) {
            return Err(format!("{key}: must be greater than 0 and at most 100"));
        }
    }
    if settings.lib_cuda_log_level > 4 {
        return Err("libCudaLogLevel: must be between 0 and 4".into());
    }
    Ok(settings)
}

/// A client from `--kubeconfig`, or the default lookup without it.
pub async fn client(args: &Args) -> Result<kube::Client, Error> {
    let Some(path) = &args.kubeconfig else {
        return kube::Client::try_default().await.map_err(Error::kube(
            "connecting to the API server (in-cluster or KUBECONFIG)",
        ));
    };
    let kubeconfig = |source| Error::Kubeconfig {
        path: path.clone(),
        source,
    };
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(path).map_err(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(kubeconfig)?;
    kube::Client::try_from(config).map_err(Error::kube(format!(
        "a client from {} (--kubeconfig)",
        path.display()
    )))
}

/// Runs the agent until the process is stopped.
pub async fn run(args: Args, defaults: NodeSettings, client: kube::Client) -> Result<(), Error> {
    if let Some(from) = &args.install_interposer_from {
        let installed = install::install_interposer(from, &args.interposer_library)?;
        tracing::info!(
            from = %from.display(),
            to = %args.interposer_library.display(),
            ?installed,
            "interposer installed"
        );
    }
    let backend: Arc<dyn Backend> = match args.backend {
        BackendKind::Nvml => Arc::new(NvmlBackend::new()?),
        BackendKind::Fake => Arc::new(FakeBackend::new(
            args.fake_gpus_file.clone().unwrap_or_default(),
            args.state_dir.join("fake-gpu-mig.json"),
        )),
    };
    let physical = backend::watch(backend.clone(), Duration::from_millis(args.gpu_poll_millis))?;
    let view = NodeView::spawn(client.clone(), &args.node_name);
    let offers = inventory::track(view.clone(), defaults, physical).await;

    std::fs::create_dir_all(&args.state_dir)
        .map_err(Error::io(format!("creating {}", args.state_dir.display())))?;
    let preload = args.state_dir.join("ld.so.preload");
    std::fs::write(&preload, format!("{CONTAINER_LIBRARY}\n"))
        .map_err(Error::io(format!("writing {}", preload.display())))?;
    let paths = HostPaths {
        library: args.interposer_library.clone(),
        preload,
        regions: args.state_dir.join("containers"),
    };

    // Nothing of DRA runs where the cluster does not serve it (Kubernetes
    // before 1.34, or resource.k8s.io/v1 turned off).
    let dra = crate::dra::dra_served(&client).await;
    let offers = if dra {
        offers
    } else {
        tracing::info!(
            api = crate::dra::discovery::RESOURCE_V1,
            "the cluster does not serve DRA; serving the GPUs through the device plugin only"
        );
        crate::door::without_dra(offers)
    };
    let doors = crate::door::track(view.clone(), offers.clone(), dra).await;
    let (plugin_state, plugin_states) = tokio::sync::watch::channel(PluginState::NotRegistered);
    let lease_lapsed = Arc::new(tokio::sync::Notify::new());
    let mut loops = Loops::default();
    loops.spawn(
        "GpuNode publisher",
        publish::gpu_node(
            client.clone(),
            args.node_name.clone(),
            offers.clone(),
            doors.clone(),
            plugin_states.clone(),
            lease_lapsed.clone(),
        ),
    );
    if dra {
        loops.spawn(
            "ResourceSlice publisher",
            crate::dra::publish::keep(view.clone(), offers.clone(), doors.clone()),
        );
        // Claims are prepared whatever the door: one allocated just before
        // a switch away from DRA still starts (the switch waits for it).
        let service = crate::dra::service::DraService::new(
            view.clone(),
            offers.clone(),
            paths.clone(),
            args.cdi_dir.clone(),
        );
        let sockets = crate::dra::server::Sockets {
            plugins_dir: args.kubelet_plugins_dir.clone(),
            registry_dir: args.plugins_registry_dir.clone(),
        };
        loops.spawn("DRA claim reconciler", service.clone().reconcile());
        loops.spawn(
            "DRA plugin server",
            crate::dra::server::run(sockets, service),
        );
    }
    // The device plugin offers nothing while the node serves through DRA.
    let plugin_offers = crate::door::gate(offers.clone(), doors);
    let lease_site = args.lease_site();
    // Owned apart: stopped and awaited before the Lease is deleted.
    let mut lease = tokio::spawn(lease::keep(
        client.clone(),
        lease_site.clone(),
        format!("tessera-node-agent/{}", args.node_name),
        lease_lapsed,
    ));
    let metrics = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(Error::io(format!("listening on {}", args.metrics_addr)))?;
    let addr = metrics
        .local_addr()
        .map_err(Error::io("the metrics listener"))?;
    tracing::info!(%addr, "metrics listening");
    loops.spawn(
        "region sharing marker",
        crate::monitor::mark_sharing(view.clone(), paths.regions.clone()),
    );
    loops.spawn(
        "compute arbiter",
        crate::monitor::arbiter::run(view.clone(), paths.regions.clone()),
    );
    loops.spawn(
        "region collector",
        crate::monitor::collect_regions(view.clone(), paths.regions.clone()),
    );
    loops.spawn(
        "metrics server",
        crate::monitor::serve(
            metrics,
            crate::monitor::Sources {
                view: view.clone(),
                offers: offers.clone(),
                regions: paths.regions.clone(),
                backend: backend.clone(),
                legacy: args.legacy_metrics,
                plugin: plugin_states.clone(),
            },
        ),
    );
    let endpoint = Endpoint {
        dir: args.device_plugin_dir.clone(),
        resource: args.resource_name.clone(),
    };
    let mig = Arc::new(crate::mig::MigManager::new(backend));
    loops.spawn(
        "MIG cleaner",
        crate::mig::clean_every_pass(mig.clone(), offers.clone(), view.clone()),
    );
    let mps_control: Arc<dyn MpsControl> = match args.backend {
        BackendKind::Nvml => Arc::new(NvidiaControl::new(&args.mps_control)),
        BackendKind::Fake => Arc::new(FakeControl),
    };
    let mps = Arc::new(MpsManager::new(mps_control, args.state_dir.join("mps")));
    loops.spawn(
        "MPS keeper",
        crate::mps::keep_daemons(mps.clone(), offers.clone()),
    );
    loops.spawn(
        "static MIG plugins",
        plugin::static_mig::serve_profiles(
            args.device_plugin_dir.clone(),
            plugin_offers.clone(),
            args.device_list(),
        ),
    );
    let service = Service::new(view, plugin_offers, paths, args.device_list(), mig, mps);
    let stopping = plugin_state.clone();
    // The plugin keeps serving while the node drains.
    let mut plugin = tokio::spawn(plugin::run(endpoint, service, plugin_state));
    tracing::info!(loops = loops.len() + 2, "the agent runs");
    let ended = tokio::select! {
        () = stop_signal() => None,
        ended = loops.ended() => Some(ended),
        joined = &mut plugin => Some(supervise::ended("device plugin server", joined)),
        joined = &mut lease => Some(supervise::ended("Lease keeper", joined)),
    };
    if let Some(ended) = ended {
        tracing::error!(error = %ended, "stopping");
        plugin.abort();
        lease.abort();
        loops.abort_all();
        return Err(ended);
    }
    stopping.send_replace(PluginState::Stopping);
    drain(
        &client,
        &args.node_name,
        Duration::from_secs(args.drain_seconds),
    )
    .await;
    plugin.abort();
    // A clean stop leaves no Lease behind (uninstall removes everything).
    lease.abort();
    let _ = lease.await;
    lease::delete(&client, &lease_site).await;
    Ok(())
}

/// SIGTERM (the kubelet stopping the DaemonSet pod) or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Before exiting: the GpuNode says `AgentStopping` (so the extender sends
/// no new pod here), then a pod already bound here gets served: wait, up to
/// `limit` in all, until the GpuNode shows it and the node's NodeLock is gone.
async fn drain(client: &kube::Client, node: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    let nodes: kube::Api<GpuNode> = kube::Api::all(client.clone());
    let locks: kube::Api<NodeLock> = kube::Api::all(client.clone());
    let marked = |n: &GpuNode| {
        n.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "AgentStopping")
        })
    };
    tracing::info!(
        node,
        "stopping: marking the node not Ready and serving any pod bound here"
    );
    while tokio::time::Instant::now() < deadline {
        let shown = nodes
            .get_opt(node)
            .await
            .ok()
            .flatten()
            .is_some_and(|n| marked(&n));
        let locked = !matches!(locks.get_opt(node).await, Ok(None));
        if shown && !locked {
            tracing::info!(node, "drained");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!(
        node,
        seconds = limit.as_secs(),
        "stopping before the node drained"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_merge_over_hami_defaults_and_refuse_nonsense() {
        let settings = parse_defaults("deviceSplitCount: 4\ngpuCorePolicy: force\n").unwrap();
        assert_eq!(settings.device_split_count, 4);
        assert_eq!(settings.device_memory_scaling, 1.0);
        assert_eq!(parse_defaults("").unwrap(), NodeSettings::default());
        assert_eq!(
            parse_defaults("frontDoor: dra").unwrap().front_door,
            tessera_api::v1alpha1::FrontDoor::Dra
        );
        for (yaml, needle) in [
            ("frontDoor: both", "both"),
            (
                "deviceSplitCount: 0",
                "deviceSplitCount: must be between 1 and 100",
            ),
            (
                "deviceMemoryScaling: 0",
                "deviceMemoryScaling: must be greater than 0",
            ),
            ("libCudaLogLevel: 9", "libCudaLogLevel"),
            ("splitCount: 4", "splitCount: unknown setting"),
            ("gpuCorePolicy: sometimes", "sometimes"),
            ("- a", "must be a mapping"),
        ] {
            let error = parse_defaults(yaml).unwrap_err();
            assert!(error.contains(needle), "{yaml}: {error}");
        }
    }

    #[test]
    fn flags_come_from_the_environment_and_fake_needs_its_file() {
        let args = Args::try_parse_from(["agent", "--node-name", "n1", "--backend", "fake"]);
        let error = args.unwrap_err().to_string();
        assert!(error.contains("--fake-gpus-file"), "{error}");
        let args = Args::try_parse_from([
            "agent",
            "--node-name",
            "n1",
            "--backend",
            "fake",
            "--fake-gpus-file",
            "/tmp/g.yaml",
        ])
        .unwrap();
        assert_eq!(args.resource_name, "nvidia.com/gpu");
        assert_eq!(
            args.device_plugin_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins/")
        );
        let error = Args::try_parse_from(["agent", "--node-name", "n1", "--gpu-poll-millis", "1"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--gpu-poll-millis"), "{error}");
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(["agent", "--node-name", "n1"].iter().chain(extra))
    }

    #[test]
    fn device_list_strategies_are_a_checked_comma_list() {
        use DeviceListStrategy::{CdiAnnotations, CdiCri, Envvar};
        let defaults = parse(&[]).unwrap().device_list();
        assert_eq!(defaults, DeviceList::default());
        assert_eq!(defaults.strategies, [Envvar]);
        let list = parse(&["--device-list-strategy=cdi-annotations,envvar,cdi-cri,envvar"])
            .unwrap()
            .device_list();
        assert_eq!(list.strategies, [Envvar, CdiCri, CdiAnnotations]);
        let list = parse(&[
            "--device-list-strategy",
            "cdi-cri",
            "--cdi-kind",
            "k8s.device-plugin.nvidia.com/gpu",
            "--cdi-annotation-prefix",
            "nvidia.cdi.k8s.io/",
        ])
        .unwrap()
        .device_list();
        assert_eq!(list.strategies, [CdiCri]);
        assert_eq!(list.cdi_kind, "k8s.device-plugin.nvidia.com/gpu");
        assert_eq!(list.cdi_annotation_prefix, "nvidia.cdi.k8s.io/");

        let error = parse(&["--device-list-strategy=envvar,volume-mounts"])
            .unwrap_err()
            .to_string();
        for needle in [
            "--device-list-strategy",
            "volume-mounts",
            "envvar",
            "cdi-cri",
            "cdi-annotations",
        ] {
            assert!(error.contains(needle), "{needle} not in {error}");
        }
        let error = parse(&["--cdi-kind=gpu"]).unwrap_err().to_string();
        assert!(
            error.contains("--cdi-kind") && error.contains("vendor/class"),
            "{error}"
        );
        let error = parse(&["--cdi-annotation-prefix=cdi.k8s.io"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--cdi-annotation-prefix") && error.contains("'/'"),
            "{error}"
        );
    }

    #[test]
    fn legacy_metrics_is_a_switch_like_hamis() {
        assert!(!parse(&[]).unwrap().legacy_metrics);
        assert!(parse(&["--legacy-metrics"]).unwrap().legacy_metrics);
        assert!(parse(&["--legacy-metrics=true"]).unwrap().legacy_metrics);
        assert!(!parse(&["--legacy-metrics=false"]).unwrap().legacy_metrics);
        let args = parse(&["--legacy-metrics", "--log", "debug"]).unwrap();
        assert!(args.legacy_metrics);
        assert_eq!(args.log, "debug");
        let error = parse(&["--legacy-metrics=sometimes"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--legacy-metrics"), "{error}");
    }

    #[test]
    fn the_interposer_is_installed_only_when_asked() {
        assert_eq!(parse(&[]).unwrap().install_interposer_from, None);
        let args =
            parse(&["--install-interposer-from=/opt/tessera/lib/libtessera_vgpu.so"]).unwrap();
        assert_eq!(
            args.install_interposer_from,
            Some(PathBuf::from("/opt/tessera/lib/libtessera_vgpu.so"))
        );
        assert_eq!(
            args.interposer_library,
            PathBuf::from("/usr/local/vgpu/libtessera_vgpu.so")
        );
    }
}
