//! Real nodes on one machine: per node a containerd (own root, state and
//! socket), a kubelet v1.36 registered with the control plane, and Tessera's
//! node agent with fake GPUs, registered with that kubelet through the real
//! device-plugin socket. Pods run for real, on a bridge network of the node's
//! own.
//!
//! Needs root, containerd, runc, the CNI plugins (`/usr/lib/cni`), busybox,
//! gcc, `unshare`/`nsenter`, and Tessera's build outputs ([`Artifacts`]).
//! Each node lives in its own mount namespace (see [`namespace`]) and cgroup
//! subtree (see [`cgroup`]); [`RealNode::stop`] (also on drop) kills every
//! process of the node, containers included, and removes its cgroups,
//! mounts, bridge and directory.

mod cgroup;
mod config;
mod namespace;
mod sysctl;

pub use config::{FakeGpu, fake_devices};

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::{core::v1::Node, resource::v1::ResourceSlice};
use kube::{Api, Client, api::ListParams};
use serde::{Deserialize, Serialize};

use crate::artifacts::Artifacts;
use crate::error::Error;
use crate::images::Archives;
use crate::net::{free_port, host_ip};
use crate::process::{self, Lifetime, Process};
use crate::tools;
use cgroup::Subtree;
use config::KubeletPorts;
use namespace::MountNamespace;

/// The kubelet's fixed device-plugin directory (inside the node's namespace).
const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";
/// How long a node has to become Ready with its GPUs advertised.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a starting kubelet may take to answer `/healthz`.
const KUBELET_HEALTHY_TIMEOUT: Duration = Duration::from_secs(90);
/// Where `stop_detached` finds what a detached node left running.
const STATE_FILE: &str = "node.json";

/// The pod network of this process's nodes (each node a /24 in it), for
/// kube-proxy's `clusterCIDR`.
pub fn cluster_cidr() -> String {
    format!("10.{}.0.0/16", pod_network_octet())
}

/// The second octet of this process's pod network `10.<octet>.0.0/16`:
/// chosen once, starting from one derived from the pid, as the first in
/// 100..=199 that no route on this machine uses yet, so a second cluster on
/// the machine (another checkout's `make demo`, a test run beside a demo)
/// never routes pods into the first one's network.
fn pod_network_octet() -> u32 {
    static OCTET: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *OCTET.get_or_init(|| {
        let routes = Command::new("ip")
            .args(["-4", "route", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        first_free_octet(100 + std::process::id() % 100, &routes)
    })
}

/// The first octet from `start` (wrapping within 100..=199) whose
/// `10.<octet>.` prefix appears in no line of `routes` (`ip -4 route`).
fn first_free_octet(start: u32, routes: &str) -> u32 {
    (0..100)
        .map(|step| 100 + (start - 100 + step) % 100)
        .find(|octet| {
            let prefix = format!("10.{octet}.");
            !routes
                .split_whitespace()
                .any(|word| word.starts_with(&prefix))
        })
        .unwrap_or(start)
}

/// What to start.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The Node's name.
    pub name: String,
    /// Its fake GPUs (with [`AgentMode::Chart`], the chart's values carry them).
    pub gpus: Vec<FakeGpu>,
    /// Labels the kubelet registers the Node with.
    pub labels: BTreeMap<String, String>,
    /// Who runs the node agent.
    pub agent: AgentMode,
}

/// Who runs a real node's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentMode {
    /// The harness, as a host process that tests stop and start.
    Host,
    /// The Helm chart's DaemonSet, as a pod of this node; the harness runs
    /// none, and the node's host paths for the agent (`/var/lib/tessera`,
    /// `/usr/local/vgpu`) are the node's own.
    Chart,
}

/// A running node.
#[derive(Debug)]
pub struct RealNode {
    name: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    artifacts: Artifacts,
    lifetime: Lifetime,
    labels: BTreeMap<String, String>,
    node_ip: String,
    ports: KubeletPorts,
    metrics_port: u16,
    bridge: String,
    cgroup: Subtree,
    namespace: Option<MountNamespace>,
    containerd: Option<Process>,
    kubelet: Option<Process>,
    agent: Option<Process>,
    agent_mode: AgentMode,
    /// Another vendor's (mock) device plugin, and the resource it advertises.
    vendor_plugin: Option<(Process, String)>,
}

/// What a node records in `<dir>/node.json` while it runs, for
/// [`stop_detached`]: after `make demo`, or when a test process died without
/// stopping its nodes.
#[derive(Debug, Serialize, Deserialize)]
struct NodeState {
    processes: Vec<(String, u32)>,
    holder: u32,
    cgroup: String,
    bridge: String,
    sysctls: sysctl::Saved,
}

/// The node agent's host paths, private to each node when the chart's
/// DaemonSet runs the agent (the chart's defaults): its state, the
/// interposer, the kubelet's plugin directories under the node's kubelet
/// root (the DRA plugin's sockets), its pod-resources socket and the CDI
/// directory containerd reads.
const AGENT_PATHS: [(&str, &str); 6] = [
    ("agent", "/var/lib/tessera"),
    ("vgpu", "/usr/local/vgpu"),
    ("kubelet/plugins", "/var/lib/kubelet/plugins"),
    ("kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
    (
        "kubelet/plugins_registry",
        "/var/lib/kubelet/plugins_registry",
    ),
    ("cdi", "/var/run/cdi"),
];

/// Paths the kubelet or containerd use that are fixed, or shared between
/// instances by default, and what each node has there instead (inside its
/// mount namespace; under the node's directory on the host).
const PRIVATE_PATHS: [(&str, &str); 4] = [
    ("device-plugins", DEVICE_PLUGIN_PATH),
    // containerd's shim sockets and runc's state.
    ("run-containerd", "/run/containerd"),
    // Pod network namespaces pinned by containerd.
    ("netns", "/run/netns"),
    // The kubelet's links to container logs.
    ("container-logs", "/var/log/containers"),
];

/// What a node needs of the control plane it joins (`ControlPlane`).
pub trait ControlPlaneView {
    /// The control plane's directory (nodes live under `nodes/`).
    fn dir(&self) -> &Path;
    /// The kubeconfig the node's components use.
    fn kubeconfig(&self) -> &Path;
    /// Whether the node's processes die with the test process.
    fn lifetime(&self) -> Lifetime;
    /// A client of the API server.
    fn client(&self) -> impl std::future::Future<Output = Result<Client, Error>> + Send;
}

impl RealNode {
    /// Starts a node in `<plane dir>/nodes/<name>` and waits until the Node
    /// is Ready with its GPUs allocatable.
    pub async fn start(
        plane: &impl ControlPlaneView,
        spec: &NodeSpec,
        artifacts: &Artifacts,
        images: &Archives,
    ) -> Result<Self, Error> {
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let index = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 250 + 1;
        // Pod subnets and bridges differ between nodes of this process and
        // from those of another harness process on this machine (bridges by
        // pid, subnets by the routes already present).
        let pid = std::process::id();
        let bridge = format!("tsr{}n{index}", pid % 100_000);
        let subnet = format!("10.{}.{index}.0/24", pod_network_octet());
        let dir = plane.dir().join("nodes").join(&spec.name);
        let _ = fs::remove_dir_all(&dir);
        for sub in ["cni/conf", "kubelet", "pod-logs"]
            .into_iter()
            .chain(PRIVATE_PATHS.map(|(sub, _)| sub))
            .chain(AGENT_PATHS.map(|(sub, _)| sub))
        {
            let path = dir.join(sub);
            fs::create_dir_all(&path).map_err(Error::io("create directory", &path))?;
        }
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            fs::write(&path, text).map_err(Error::io("write", &path))
        };
        write(
            "cni/conf/10-tessera.conflist",
            config::cni(&dir, &bridge, &subnet),
        )?;
        write("gpus.yaml", config::fake_gpus(&spec.gpus))?;
        let cgroup = Subtree::create(&cgroup_name(plane.dir(), &spec.name))?;
        let mut node = Self {
            name: spec.name.clone(),
            dir: dir.clone(),
            kubeconfig: plane.kubeconfig().to_owned(),
            artifacts: artifacts.clone(),
            lifetime: plane.lifetime(),
            labels: spec.labels.clone(),
            node_ip: host_ip()?,
            ports: KubeletPorts {
                api: free_port()?,
                healthz: free_port()?,
            },
            metrics_port: free_port()?,
            bridge,
            cgroup,
            namespace: None,
            containerd: None,
            kubelet: None,
            agent: None,
            agent_mode: spec.agent,
            vendor_plugin: None,
        };
        sysctl::original();
        let namespace = MountNamespace::create(dir.join("namespace.log"), node.lifetime)?;
        node.namespace = Some(namespace);
        node.record()?;
        let agent_paths: &[(&str, &str)] = match spec.agent {
            AgentMode::Host => &[],
            AgentMode::Chart => &AGENT_PATHS,
        };
        for (sub, target) in PRIVATE_PATHS.iter().chain(agent_paths) {
            node.namespace()?.bind(&dir.join(sub), Path::new(target))?;
        }
        node.namespace()?.share(&dir.join("kubelet"))?;
        if spec.agent == AgentMode::Chart {
            // The MPS host's init container mounts the MPS clients' tmpfs
            // under the agent's state directory and propagates it to the
            // node (Bidirectional), which needs a shared mount there, as
            // `/` is on a real node.
            node.namespace()?
                .make_shared(Path::new("/var/lib/tessera"))?;
        }
        node.start_containerd(images).await?;
        node.start_kubelet().await?;
        if spec.agent == AgentMode::Host {
            node.start_agent()?;
        }
        node.wait_ready(&plane.client().await?).await?;
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's directory (logs, configuration, state).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The port of the node agent's `/metrics` on 127.0.0.1.
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// The mounts the node sees (`/proc/<pid>/mountinfo` of its mount
    /// namespace), as the kernel lists them.
    pub fn mounts(&self) -> Result<String, Error> {
        let file = PathBuf::from(format!(
            "/proc/{}/mountinfo",
            self.namespace()?.holder.pid()
        ));
        std::fs::read_to_string(&file).map_err(Error::io("read", &file))
    }

    fn namespace(&self) -> Result<&MountNamespace, Error> {
        self.namespace
            .as_ref()
            .ok_or_else(|| Error::Config(format!("node {} is stopped", self.name)))
    }

    fn spawn_inside(&self, name: &str, program: &Path, args: &[String]) -> Result<Process, Error> {
        let args = self.namespace()?.enter_args(program, args);
        Process::spawn(
            name,
            Path::new("nsenter"),
            &args,
            self.dir.join(format!("{name}.log")),
            self.lifetime,
        )
    }

    async fn start_containerd(&mut self, images: &Archives) -> Result<(), Error> {
        let config = self.dir.join("containerd.toml");
        fs::write(&config, config::containerd(&self.dir, free_port()?))
            .map_err(Error::io("write", &config))?;
        let cdi = self.dir.join("cdi");
        fs::create_dir_all(&cdi).map_err(Error::io("create", &cdi))?;
        // containerd 2 from the tool cache (CDI on), finding its own runc
        // shim first on PATH (not an older one from the system's packages).
        let tools_dir = tools::bin_dir()?;
        let path = match std::env::var("PATH") {
            Ok(path) => format!("{}:{path}", tools_dir.display()),
            Err(_) => tools_dir.display().to_string(),
        };
        let mut containerd = self.spawn_inside(
            "containerd",
            Path::new("env"),
            &[
                format!("PATH={path}"),
                tools_dir.join("containerd").display().to_string(),
                "--config".to_owned(),
                config.display().to_string(),
            ],
        )?;
        self.cgroup.adopt(containerd.pid())?;
        let socket = self.dir.join("containerd.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            containerd.check_running()?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("containerd of {}", self.name),
                    seconds: 30,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.containerd = Some(containerd);
        self.record()?;
        for archive in &images.paths {
            let output = Command::new(tools::binary("ctr")?)
                .arg("--address")
                .arg(&socket)
                .args(["-n", "k8s.io", "images", "import"])
                .arg(archive)
                .output()
                .map_err(Error::io("run ctr images import", archive))?;
            if !output.status.success() {
                return Err(Error::Config(format!(
                    "importing {} into {}: {}",
                    archive.display(),
                    self.name,
                    String::from_utf8_lossy(&output.stderr).trim()
                )));
            }
        }
        Ok(())
    }

    /// Starts the kubelet (again, after [`RealNode::stop_kubelet`]) and waits
    /// until it is healthy.
    pub async fn start_kubelet(&mut self) -> Result<(), Error> {
        let cgroup_v1 = !Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let config = self.dir.join("kubelet.yaml");
        let text = config::kubelet(
            &self.dir,
            &self.node_ip,
            &self.cgroup.kubelet_root(),
            self.ports,
            cgroup_v1,
            crate::tools::kubelet_minor()?,
        );
        fs::write(&config, text).map_err(Error::io("write", &config))?;
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut args = vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--root-dir={}", self.dir.join("kubelet").display()),
            format!("--cert-dir={}", self.dir.join("kubelet/pki").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.node_ip),
            "--v=1".to_owned(),
        ];
        if !labels.is_empty() {
            args.push(format!("--node-labels={}", labels.join(",")));
        }
        let mut kubelet = self.spawn_inside("kubelet", &crate::tools::binary("kubelet")?, &args)?;
        let addr = format!("127.0.0.1:{}", self.ports.healthz);
        // As long as a node may take to be Ready: with several nodes starting
        // at once on two cores, a kubelet once needed more than 60 s.
        let deadline = Instant::now() + KUBELET_HEALTHY_TIMEOUT;
        while !crate::http::get_ok(&addr, "/healthz").await {
            kubelet.check_running()?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("kubelet of {} to be healthy", self.name),
                    seconds: KUBELET_HEALTHY_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.kubelet = Some(kubelet);
        self.record()
    }

    /// Stops the kubelet (its containers keep running, as on a real node).
    pub fn stop_kubelet(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
    }

    /// Starts the node agent with the fake GPU backend, registering with
    /// this node's kubelet.
    pub fn start_agent(&mut self) -> Result<(), Error> {
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--node-name={}", self.name),
            "--backend=fake".to_owned(),
            format!("--fake-gpus-file={}", self.dir.join("gpus.yaml").display()),
            format!(
                "--device-plugin-dir={}",
                self.dir.join("device-plugins").display()
            ),
            format!(
                "--kubelet-plugins-dir={}",
                self.dir.join("kubelet/plugins").display()
            ),
            format!(
                "--plugins-registry-dir={}",
                self.dir.join("kubelet/plugins_registry").display()
            ),
            format!("--cdi-dir={}", self.dir.join("cdi").display()),
            format!(
                "--pod-resources-socket={}",
                self.dir
                    .join("kubelet/pod-resources/kubelet.sock")
                    .display()
            ),
            format!(
                "--interposer-library={}",
                self.artifacts.interposer.display()
            ),
            format!("--state-dir={}", self.dir.join("agent").display()),
            // The fake driver reads the variable; no NVIDIA toolkit.
            "--device-list-strategy=envvar".to_owned(),
            "--accept-envvar-device-selection".to_owned(),
            format!("--metrics-addr=127.0.0.1:{}", self.metrics_port),
            // Inside the harness's 5 s between SIGTERM and SIGKILL.
            "--drain-seconds=3".to_owned(),
        ];
        let agent = Process::spawn(
            "tessera-node-agent",
            &self.artifacts.agent,
            &args,
            self.dir.join("tessera-node-agent.log"),
            self.lifetime,
        )?;
        self.agent = Some(agent);
        self.record()
    }

    /// Starts a mock vendor device plugin for this node's kubelet
    /// (`tessera-mock-vendor-plugin`, from the artifacts' directory), with
    /// `vendor` and `devices`; the node then counts as having GPUs once its
    /// kubelet advertises the vendor's resource.
    pub fn start_vendor_plugin(
        &mut self,
        vendor: crate::mock_vendor::Vendor,
        devices: Vec<crate::mock_vendor::MockDevice>,
    ) -> Result<(), Error> {
        let plugin = crate::mock_vendor::MockPlugin {
            vendor,
            node: self.name.clone(),
            devices,
            plugin_dir: self.dir.join("device-plugins"),
            interval: Duration::from_secs(10),
        };
        let spec = self.dir.join("mock-vendor-plugin.json");
        let text =
            serde_json::to_string_pretty(&plugin).map_err(|e| Error::Config(e.to_string()))?;
        fs::write(&spec, text).map_err(Error::io("write", &spec))?;
        let program = self.artifacts.mock_vendor_plugin()?;
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--spec={}", spec.display()),
        ];
        let process = Process::spawn(
            "tessera-mock-vendor-plugin",
            &program,
            &args,
            self.dir.join("tessera-mock-vendor-plugin.log"),
            self.lifetime,
        )?;
        self.vendor_plugin = Some((process, plugin.resource()));
        self.record()
    }

    /// Stops the node agent.
    pub fn stop_agent(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.stop();
        }
    }

    /// Waits until the Node is Ready and, unless the chart runs the agent
    /// (not installed yet when a node starts), advertises its GPUs.
    pub async fn wait_ready(&mut self, client: &Client) -> Result<(), Error> {
        let gpus = self.agent_mode == AgentMode::Host;
        self.wait(client, gpus).await
    }

    /// Waits until the Node is Ready and advertises its GPUs (as slices or
    /// as static MIG instances), or publishes them in its ResourceSlice
    /// (a node behind the DRA front door).
    pub async fn wait_gpus(&mut self, client: &Client) -> Result<(), Error> {
        self.wait(client, true).await
    }

    async fn wait(&mut self, client: &Client, want_gpus: bool) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        let ours = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.name,
            tessera_api::names::dra::DRIVER
        ));
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = None;
        loop {
            if let Some(node) = nodes.get_opt(&self.name).await? {
                let status = node.status.unwrap_or_default();
                let ready = status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                // GPU slices, or static MIG instances (`nvidia.com/mig-*`).
                let allocatable = status.allocatable.unwrap_or_default();
                let gpus = allocatable.iter().any(|(name, q)| {
                    (name == tessera_api::names::resources::GPU
                        || name.starts_with("nvidia.com/mig-"))
                        && q.0 != "0"
                }) || self.vendor_plugin.as_ref().is_some_and(|(_, resource)| {
                    allocatable.get(resource).is_some_and(|q| q.0 != "0")
                }) || (want_gpus && published_slices(&slices, &ours).await?);
                if ready && (gpus || !want_gpus) {
                    return Ok(());
                }
                last = Some((ready, gpus));
            }
            for process in [&mut self.containerd, &mut self.kubelet, &mut self.agent]
                .into_iter()
                .flatten()
                .chain(self.vendor_plugin.as_mut().map(|(p, _)| p))
            {
                process.check_running()?;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = ["kubelet", "tessera-node-agent", "containerd"]
                    .iter()
                    .map(|name| {
                        let log = self.dir.join(format!("{name}.log"));
                        format!("--- {}:\n{}", log.display(), process::log_tail(&log, 15))
                    })
                    .collect();
                return Err(Error::Timeout {
                    what: format!(
                        "node {} to be Ready with GPUs (last seen: {last:?})\n{}",
                        self.name,
                        logs.join("\n")
                    ),
                    seconds: READY_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops everything the node runs and removes what it left behind;
    /// also after a start that failed half-way.
    pub fn stop(&mut self) {
        if let Some((mut plugin, _)) = self.vendor_plugin.take() {
            plugin.stop();
        }
        self.stop_agent();
        self.stop_kubelet();
        // Containers, shims and containerd: everything in the subtree.
        self.cgroup.destroy();
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop();
        }
        // Ends the mount namespace and every mount made in it.
        self.namespace.take();
        sysctl::restore(&sysctl::original());
        cleanup(&self.bridge, &self.dir);
    }

    fn state(&self) -> NodeState {
        NodeState {
            processes: [&self.containerd, &self.kubelet, &self.agent]
                .into_iter()
                .flatten()
                .chain(self.vendor_plugin.as_ref().map(|(p, _)| p))
                .map(|p| (p.name().to_owned(), p.pid()))
                .collect(),
            holder: self.namespace.as_ref().map_or(0, |n| n.holder.pid()),
            cgroup: self.cgroup.name().to_owned(),
            bridge: self.bridge.clone(),
            sysctls: sysctl::original(),
        }
    }

    /// Writes `<dir>/node.json` (after every process start).
    fn record(&self) -> Result<(), Error> {
        let path = self.dir.join(STATE_FILE);
        let json = serde_json::to_string_pretty(&self.state())
            .map_err(|e| Error::Config(e.to_string()))?;
        fs::write(&path, json).map_err(Error::io("write", &path))
    }

    /// Leaves the node running (`make demo`); [`stop_detached`] stops it.
    pub fn detach(mut self) -> Result<PathBuf, Error> {
        self.record()?;
        for process in [
            self.containerd.take(),
            self.kubelet.take(),
            self.agent.take(),
            self.vendor_plugin.take().map(|(p, _)| p),
        ]
        .into_iter()
        .flatten()
        {
            process.release();
        }
        if let Some(namespace) = self.namespace.take() {
            namespace.holder.release();
        }
        // Nothing is left for drop to stop; keep the directory.
        let dir = std::mem::take(&mut self.dir);
        self.bridge.clear();
        Ok(dir)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if !self.dir.as_os_str().is_empty() {
            self.stop();
        }
    }
}

/// Stops a node whose processes this process does not own (left running by
/// [`RealNode::detach`], or by a test process that died) and removes its
/// directory. Returns whether one was found.
pub fn stop_detached(dir: &Path) -> Result<bool, Error> {
    let path = dir.join(STATE_FILE);
    let Ok(json) = fs::read_to_string(&path) else {
        return Ok(false);
    };
    let state: NodeState = serde_json::from_str(&json)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    for (name, pid) in state.processes.iter().rev() {
        process::stop_detached(*pid, name);
    }
    Subtree::named(&state.cgroup).destroy();
    process::stop_detached(state.holder, "sleep");
    sysctl::restore(&state.sysctls);
    cleanup(&state.bridge, dir);
    Ok(true)
}

fn cleanup(bridge: &str, dir: &Path) {
    if !bridge.is_empty() {
        let _ = Command::new("ip").args(["link", "delete", bridge]).output();
    }
    let _ = fs::remove_dir_all(dir);
}

/// The cgroup of node `node` of the cluster in `plane_dir`: unique per
/// cluster directory, so two clusters (two `make demo` checkouts, whose
/// directories share the base name `.tessera-demo`) never share a node's
/// cgroup, whose creation kills what it holds.
fn cgroup_name(plane_dir: &Path, node: &str) -> String {
    let absolute = fs::canonicalize(plane_dir).unwrap_or_else(|_| plane_dir.to_owned());
    // FNV-1a: stable across runs and builds (std's hasher is not).
    let hash = absolute
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let base = plane_dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    format!("tessera-{base}-{:08x}-{node}", hash >> 32)
}

/// Whether the node's DRA driver published devices; `false` where the
/// cluster serves no `resource.k8s.io/v1` (the API server answers 404).
async fn published_slices(slices: &Api<ResourceSlice>, ours: &ListParams) -> Result<bool, Error> {
    match slices.list(ours).await {
        Ok(list) => Ok(list
            .items
            .iter()
            .any(|s| s.spec.devices.as_ref().is_some_and(|d| !d.is_empty()))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::{cgroup_name, first_free_octet};
    use std::path::Path;

    #[test]
    fn clusters_with_the_same_directory_name_get_different_cgroups() {
        let one = cgroup_name(Path::new("/home/a/tessera/.tessera-demo"), "gpu-a");
        let other = cgroup_name(Path::new("/home/b/tessera/.tessera-demo"), "gpu-a");
        assert_ne!(one, other);
        assert!(
            one.starts_with("tessera-.tessera-demo-") && one.ends_with("-gpu-a"),
            "{one}"
        );
        assert_eq!(
            one,
            cgroup_name(Path::new("/home/a/tessera/.tessera-demo"), "gpu-a"),
            "stable for one cluster"
        );
        assert_ne!(
            one,
            cgroup_name(Path::new("/home/a/tessera/.tessera-demo"), "gpu-b")
        );
    }

    #[test]
    fn a_pod_network_in_use_is_skipped() {
        let routes = "default via 172.17.0.1 dev eth0\n\
                      10.142.1.0/24 dev tsr4242n1 proto kernel scope link src 10.142.1.1\n\
                      10.143.2.0/24 dev tsr4343n2 proto kernel scope link src 10.143.2.1\n";
        assert_eq!(first_free_octet(142, routes), 144);
        assert_eq!(first_free_octet(150, routes), 150);
        assert_eq!(
            first_free_octet(199, "10.199.1.0/24 dev x\n"),
            100,
            "wraps within 100..=199"
        );
    }
}
