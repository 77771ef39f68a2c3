//! The agent's flags (each with its environment variable) and `--defaults`.

use std::path::PathBuf;

use clap::{ArgAction, Parser, ValueEnum};
use tessera_api::v1alpha1::NodeSettings;

use crate::{
    Error,
    lease::{self, LeaseSite},
    plugin::{
        DEFAULT_CDI_ANNOTATION_PREFIX, DEFAULT_CDI_KIND, DeviceList, DeviceListStrategy,
        parse_cdi_annotation_prefix, parse_cdi_kind,
    },
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
#[command(
    name = "tessera-node-agent",
    version,
    about,
    after_help = "`tessera-node-agent mps-daemons --help`: the MPS host, which runs the node's MPS control daemons apart from the agent."
)]
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
    /// The kubelet's pod-resources socket, which says which pod holds which
    /// static MIG instance (`<root-dir>/pod-resources/kubelet.sock`); read
    /// only while the node serves static MIG instances.
    #[arg(long, env = "TESSERA_POD_RESOURCES_SOCKET", default_value = tessera_deviceplugin::POD_RESOURCES_SOCKET)]
    pub pod_resources_socket: PathBuf,
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
    /// container annotation). `envvar` alone needs
    /// `--accept-envvar-device-selection`.
    #[arg(
        long,
        env = "TESSERA_DEVICE_LIST_STRATEGY",
        value_enum,
        value_delimiter = ',',
        default_value = "cdi-cri"
    )]
    pub device_list_strategy: Vec<DeviceListStrategy>,
    /// Confirms that with `--device-list-strategy=envvar` alone the nodes'
    /// NVIDIA container toolkit ignores `NVIDIA_VISIBLE_DEVICES` from
    /// unprivileged containers
    /// (`accept-nvidia-visible-devices-envvar-when-unprivileged = false`):
    /// otherwise a container's own variable (`envFrom` a ConfigMap) picks
    /// any GPU of the node, and the agent refuses to start.
    #[arg(
        long,
        env = "TESSERA_ACCEPT_ENVVAR_DEVICE_SELECTION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = ArgAction::Set
    )]
    pub accept_envvar_device_selection: bool,
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
    /// `--profiling` and `--profiling-addr`.
    #[command(flatten)]
    pub profiling: tessera_profiling::ProfilingArgs,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "TESSERA_LOG", default_value = "info")]
    pub log: String,
    /// On SIGTERM, how long to wait for a pod already bound here to be
    /// served (its NodeLock to go) after marking the GpuNode not Ready, in
    /// seconds; keep it under the pod's termination grace period.
    #[arg(long, env = "TESSERA_DRAIN_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=300))]
    pub drain_seconds: u64,
    /// NVIDIA's MPS control program, through which Allocate asks a GPU's
    /// daemon whether it answers (the MPS host, `tessera-node-agent
    /// mps-daemons`, runs the daemons; with `--backend fake`, fake ones).
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

    /// Refuses `--device-list-strategy=envvar` alone without
    /// `--accept-envvar-device-selection`, saying why.
    pub fn check_device_list(&self) -> Result<(), Error> {
        let list = self.device_list();
        if list.strategies != [DeviceListStrategy::Envvar] || self.accept_envvar_device_selection {
            return Ok(());
        }
        Err(Error::Config(
            "--device-list-strategy=envvar alone passes a container its GPUs through NVIDIA_VISIBLE_DEVICES, which the container's own environment (envFrom a ConfigMap) can also set: under the NVIDIA container toolkit's defaults, NVIDIA_VISIBLE_DEVICES=all then reaches every GPU of the node. Use --device-list-strategy=cdi-cri, or set accept-nvidia-visible-devices-envvar-when-unprivileged = false in the nodes' toolkit config and pass --accept-envvar-device-selection (TESSERA_ACCEPT_ENVVAR_DEVICE_SELECTION=true); see docs/install.md".into(),
        ))
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
        assert_eq!(defaults.strategies, [CdiCri], "not envvar by default");
        assert_eq!(defaults.cdi_kind, DEFAULT_CDI_KIND);
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
    fn envvar_alone_is_refused_unless_accepted() {
        assert!(parse(&[]).unwrap().check_device_list().is_ok());
        let error = parse(&["--device-list-strategy=envvar"])
            .unwrap()
            .check_device_list()
            .unwrap_err()
            .to_string();
        for needle in [
            "NVIDIA_VISIBLE_DEVICES",
            "envFrom",
            "every GPU",
            "cdi-cri",
            "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
            "--accept-envvar-device-selection",
        ] {
            assert!(error.contains(needle), "{needle} not in {error}");
        }
        for accepted in [
            &[
                "--device-list-strategy=envvar",
                "--accept-envvar-device-selection",
            ][..],
            &[
                "--device-list-strategy=envvar",
                "--accept-envvar-device-selection=true",
            ],
            &["--device-list-strategy=envvar,cdi-cri"],
            &["--device-list-strategy=cdi-annotations"],
        ] {
            let args = parse(accepted).unwrap();
            assert!(args.check_device_list().is_ok(), "{accepted:?}");
        }
        let off = parse(&[
            "--device-list-strategy=envvar",
            "--accept-envvar-device-selection=false",
        ])
        .unwrap();
        assert!(off.check_device_list().is_err());
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

    #[test]
    fn profiling_flags_parse_beside_the_agents() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let args = Args::try_parse_from([
            "agent",
            "--node-name",
            "n1",
            "--backend",
            "fake",
            "--fake-gpus-file=/g.yaml",
            "--profiling",
        ])
        .unwrap();
        assert!(args.profiling.profiling);
        assert_eq!(args.profiling.profiling_addr.to_string(), "127.0.0.1:6060");
    }
}
