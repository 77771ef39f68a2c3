//! A local cluster running Tessera the way users install it: a control plane
//! serving pods (kube-controller-manager, the cluster's default kube-scheduler,
//! kube-proxy routing Services), real nodes (containerd + kubelet) with the
//! locally built images imported, and `helm install` of `charts/tessera`. The
//! node agents run as the chart's DaemonSet pods, kube-scheduler and
//! tessera-controller as the chart's Deployment; the only difference from a
//! real cluster is in the values (fake GPUs, locally built images).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use tessera_api::v1alpha1::GpuNodeConfig;

use crate::{
    artifacts::Artifacts,
    control_plane::ControlPlane,
    control_plane::Options,
    error::Error,
    helm, images,
    kube_proxy::KubeProxy,
    node::{self, AgentMode, FakeGpu, NodeSpec, RealNode},
    process::Lifetime,
};

/// The namespace and release Tessera is installed as.
pub const NAMESPACE: &str = "tessera-system";
/// The Helm release name (objects are named `tessera-…`).
pub const RELEASE: &str = "tessera";
/// How long `helm install --wait` may take (pods start from local images).
const INSTALL_TIMEOUT: &str = "180s";

/// One node to start: its name and fake GPUs.
#[derive(Debug, Clone, Default)]
pub struct NodeGpus {
    /// The Node's name.
    pub name: String,
    /// Its fake GPUs, given to the chart's agent through values.
    pub gpus: Vec<FakeGpu>,
    /// UUIDs of its fake GPUs in MIG mode (the chart's `agent.fakeMig`).
    pub mig: Vec<String>,
    /// MIG instances the operator made, by GPU UUID: profile names (the
    /// fake file's `mig.geometry`, for static MIG).
    pub mig_geometry: BTreeMap<String, Vec<String>>,
    /// Another vendor's devices: the node runs a mock of that vendor's
    /// device plugin (`tessera-mock-vendor-plugin`), and Tessera's agent
    /// only if it also has fake NVIDIA GPUs (a mixed node; otherwise it is
    /// not labelled `gpu: "on"`).
    pub vendor: Option<(
        crate::mock_vendor::Vendor,
        Vec<crate::mock_vendor::MockDevice>,
    )>,
}

impl NodeGpus {
    /// Whether Tessera's agent serves the node: it has no other vendor's
    /// devices, or it has fake NVIDIA GPUs beside them.
    pub fn serves_nvidia(&self) -> bool {
        self.vendor.is_none() || !self.gpus.is_empty()
    }
}

/// What runs: the real nodes, kube-proxy and the control plane (dropped in
/// that order).
#[derive(Debug)]
pub struct LocalCluster {
    /// The real nodes.
    pub nodes: Vec<RealNode>,
    proxy: Option<KubeProxy>,
    /// The control plane (with kube-controller-manager and kube-scheduler).
    pub plane: ControlPlane,
    /// The values file the release was installed with.
    pub values: PathBuf,
    /// This process's turn: one local cluster at a time (below).
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// A local cluster owns the machine's service rules (kube-proxy) while it
/// runs, so the tests of one binary that start one take turns instead of
/// failing on each other's kube-proxy lock.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl LocalCluster {
    /// Starts the control plane, kube-proxy and `nodes`, imports into each
    /// node the images it runs (`node_images`) and installs the chart with
    /// `--wait`; returns once every node advertises its GPUs.
    pub async fn start(
        dir: Option<PathBuf>,
        lifetime: Lifetime,
        nodes: &[NodeGpus],
        artifacts: &Artifacts,
    ) -> Result<Self, Error> {
        Self::start_with(dir, lifetime, nodes, artifacts, json!({})).await
    }

    /// [`LocalCluster::start`] with `extra` chart values on top of the
    /// cluster's (top-level keys replace the cluster's; Helm merges them
    /// with the chart's defaults), e.g. `{"nodeDefaults": {"operatingMode": "mig"}}`.
    pub async fn start_with(
        dir: Option<PathBuf>,
        lifetime: Lifetime,
        nodes: &[NodeGpus],
        artifacts: &Artifacts,
        extra: Value,
    ) -> Result<Self, Error> {
        Self::start_with_configs(dir, lifetime, nodes, artifacts, extra, &[]).await
    }

    /// [`LocalCluster::start_with`] where `configs` exist before Tessera is
    /// installed, as a GitOps repository would have them: the CRDs are
    /// applied and the GpuNodeConfigs created first (helm then leaves the
    /// existing CRDs alone), so each agent's first offer already follows them.
    pub async fn start_with_configs(
        dir: Option<PathBuf>,
        lifetime: Lifetime,
        nodes: &[NodeGpus],
        artifacts: &Artifacts,
        extra: Value,
        configs: &[GpuNodeConfig],
    ) -> Result<Self, Error> {
        let turn = ONE_AT_A_TIME.lock().await;
        let plane = ControlPlane::start_with(Options {
            dir,
            lifetime,
            install_crds: !configs.is_empty(),
            serve_pods: true,
            ..Options::default()
        })
        .await?;
        let api: Api<GpuNodeConfig> = Api::all(plane.client().await?);
        for config in configs {
            api.create(&PostParams::default(), config).await?;
        }
        plane.start_controller_manager().await?;
        plane
            .start_scheduler("profiles:\n- schedulerName: default-scheduler\n")
            .await?;
        let archives = images::build_all(&plane.dir().join("images"), artifacts)?;
        let mut running = Vec::new();
        for (index, wanted) in nodes.iter().enumerate() {
            let mut labels = match &wanted.vendor {
                None => BTreeMap::new(),
                Some((vendor, _)) => vendor.node_labels(),
            };
            if wanted.serves_nvidia() {
                labels.insert("gpu".to_owned(), "on".to_owned());
            }
            let spec = NodeSpec {
                name: wanted.name.clone(),
                gpus: wanted.gpus.clone(),
                labels,
                agent: AgentMode::Chart,
            };
            let mut node = RealNode::start(
                &plane,
                &spec,
                artifacts,
                &node_images(&archives, wanted, index),
            )
            .await?;
            if let Some((vendor, devices)) = &wanted.vendor {
                node.start_vendor_plugin(vendor.clone(), devices.clone())?;
            }
            running.push(node);
        }
        // kube-proxy waits for its own Node: the first node's name.
        let first = nodes
            .first()
            .ok_or_else(|| Error::Config("a local cluster needs at least one node".into()))?;
        let proxy = plane
            .start_kube_proxy(&node::cluster_cidr(), &first.name)
            .await?;
        let values = plane.dir().join("tessera-values.json");
        let mut all = values_for(nodes, &archives);
        merge(&mut all, extra);
        let text = serde_json::to_string_pretty(&all).map_err(|e| Error::Config(e.to_string()))?;
        std::fs::write(&values, text).map_err(Error::io("write", &values))?;
        let mut cluster = Self {
            nodes: running,
            proxy: Some(proxy),
            plane,
            values,
            _turn: turn,
        };
        cluster.helm_install(&[]).await?;
        Ok(cluster)
    }

    /// `helm upgrade --install --wait` with the cluster's values plus `extra`
    /// arguments, then waits until the webhook answers through its Service
    /// and every node advertises its GPUs.
    pub async fn helm_install(&mut self, extra: &[&str]) -> Result<String, Error> {
        let mut command = helm::command(Some(self.plane.kubeconfig()))?;
        command
            .args(["upgrade", "--install", RELEASE])
            .arg(helm::chart_dir())
            .args(["--namespace", NAMESPACE, "--create-namespace"])
            .arg("--values")
            .arg(&self.values)
            .args(["--wait", "--timeout", INSTALL_TIMEOUT])
            .args(extra);
        let out = helm::run(&mut command).map_err(|e| self.explain(e))?;
        let client = self.plane.client().await?;
        wait_webhook(&client).await?;
        for node in &mut self.nodes {
            node.wait_gpus(&client).await?;
        }
        Ok(out)
    }

    /// `helm uninstall --wait`.
    pub fn helm_uninstall(&self) -> Result<String, Error> {
        let mut command = helm::command(Some(self.plane.kubeconfig()))?;
        command.args(["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"]);
        helm::run(&mut command)
    }

    /// Tessera's pods in [`NAMESPACE`] with `component` (`scheduler` or
    /// `node-agent`).
    pub async fn pods(&self, component: &str) -> Result<Vec<Pod>, Error> {
        let pods: Api<Pod> = Api::namespaced(self.plane.client().await?, NAMESPACE);
        let selector =
            format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}");
        Ok(pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items)
    }

    /// The chart's node-agent pod on `node`.
    pub async fn agent_pod(&self, node: &str) -> Result<Pod, Error> {
        self.pods("node-agent")
            .await?
            .into_iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .ok_or_else(|| Error::Config(format!("no node-agent pod on {node}")))
    }

    /// The address of the node agent's `/metrics` on `node` (its pod's IP).
    pub async fn agent_metrics(&self, node: &str) -> Result<String, Error> {
        let pod = self.agent_pod(node).await?;
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| Error::Config(format!("the node-agent pod on {node} has no IP")))?;
        Ok(format!("{ip}:9394"))
    }

    /// Leaves everything running (`make demo`); `tessera-demo down` stops it.
    pub fn detach(self) -> Result<PathBuf, Error> {
        let Self {
            nodes,
            proxy,
            plane,
            values: _,
            _turn,
        } = self;
        if let Some(proxy) = proxy {
            proxy.detach();
        }
        for node in nodes {
            node.detach()?;
        }
        plane.detach()
    }

    /// Adds the state of Tessera's pods to an install error.
    fn explain(&self, error: Error) -> Error {
        let mut command = match self.plane.kubectl() {
            Ok(command) => command,
            Err(_) => return error,
        };
        let pods = command
            .args(["get", "pods", "-A", "-o", "wide"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        // Pods stuck before running: the nodes' containerd and kubelet say why.
        let mut logs = String::new();
        for node in &self.nodes {
            for name in ["containerd", "kubelet"] {
                let log = node.dir().join(format!("{name}.log"));
                logs.push_str(&format!(
                    "--- {}:\n{}\n",
                    log.display(),
                    crate::process::log_tail(&log, 10)
                ));
            }
        }
        Error::Config(format!("{error}\npods:\n{pods}{logs}"))
    }
}

/// How long the webhook may take to answer after `helm install --wait`.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until the API server reaches the webhook through its Service.
/// `helm --wait` returns once the controller pod is Ready, but its
/// EndpointSlice and kube-proxy's rules follow a moment later; a GPU pod
/// created in between is refused (`failurePolicy: Fail`) with "connection
/// refused". A dry-run GPU pod goes through admission, webhook included,
/// and is stored nowhere; any answer but "failed calling webhook" means the
/// webhook was reached.
async fn wait_webhook(client: &kube::Client) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // The webhook's match condition: a container asking for a GPU.
    let probe: Pod = serde_json::from_value(crate::pods::gpu_pod(
        "tessera-webhook-probe",
        1,
        None,
        "true",
    ))
    .map_err(|e| Error::Config(e.to_string()))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = tokio::time::Instant::now() + WEBHOOK_TIMEOUT;
    loop {
        match pods.create(&dry_run, &probe).await {
            Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => {
                if tokio::time::Instant::now() > deadline {
                    return Err(Error::Timeout {
                        what: format!("the webhook to answer ({})", status.message),
                        seconds: WEBHOOK_TIMEOUT.as_secs(),
                    });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => return Ok(()),
        }
    }
}

/// The label every kubelet sets to its node's name.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// What the `index`th node imports: every image on the first node (the
/// scheduler's pod runs there, see [`values_for`]); elsewhere the demo
/// images, and the agent's where the agent runs (`gpu=on`). Every image a
/// node imports costs it two copies on disk (content and snapshot), and a
/// cluster of eight nodes otherwise holds 5 GB of them.
fn node_images(archives: &images::Archives, node: &NodeGpus, index: usize) -> images::Archives {
    let mut skipped = Vec::new();
    if index > 0 {
        skipped.extend(["tessera-controller", "kube-scheduler"]);
    }
    if !node.serves_nvidia() {
        skipped.push("tessera-node-agent");
    }
    archives.except(&skipped)
}

/// The chart values of the local cluster: fake GPUs per node and the locally
/// built images, and the scheduler's pod on the first node (the only one
/// its images are imported into, see `node_images`). Everything else is
/// the chart's defaults.
pub fn values_for(nodes: &[NodeGpus], archives: &images::Archives) -> Value {
    let fake: serde_json::Map<String, Value> = nodes
        .iter()
        .filter(|n| n.serves_nvidia())
        .map(|n| (n.name.clone(), json!(node::fake_devices(&n.gpus))))
        .collect();
    let mig: serde_json::Map<String, Value> = nodes
        .iter()
        .filter(|n| !n.mig.is_empty())
        .map(|n| {
            (
                n.name.clone(),
                json!({"enabled": n.mig, "createLatencyMs": 200, "geometry": n.mig_geometry}),
            )
        })
        .collect();
    let image = |name: &str| -> Value {
        let (repository, tag) = archives.reference(name).unwrap_or_default();
        json!({"repository": repository, "tag": tag})
    };
    let mut values = json!({
        "scheduler": {
            "replicas": 1,
            "kubeScheduler": {"image": image("kube-scheduler")},
            "controller": {"image": image("tessera-controller")},
            "nodeSelector": nodes.first().map(|n| json!({HOSTNAME_LABEL: n.name})),
        },
        "agent": {
            "image": image("tessera-node-agent"),
            "backend": "fake",
            "fakeGpus": fake,
            "fakeMig": mig,
            // Within the harness's 5 s between SIGTERM and SIGKILL.
            "drainSeconds": 3,
            // No NVIDIA toolkit on these nodes: the fake driver picks its
            // GPUs from the variable (cdi_nodes.rs adds cdi-cri).
            "deviceListStrategy": ["envvar"],
            "acceptEnvvarDeviceSelection": true,
        },
    });
    // Traces go where the caller's OTLP settings say (as for any component).
    if let Ok(endpoint) = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        values["otel"] = json!({"endpoint": endpoint});
    }
    values
}

/// How long tests wait for a pod of the chart.
pub const POD_WAIT: Duration = Duration::from_secs(120);

/// `extra` over `values`, key by key (objects merge, anything else
/// replaces), as helm merges `-f` files: `{"agent": {"mpsHost": ..}}`
/// keeps the rest of the cluster's agent values.
fn merge(values: &mut Value, extra: Value) {
    match (values, extra) {
        (Value::Object(values), Value::Object(extra)) => {
            for (key, value) in extra {
                match values.get_mut(&key) {
                    Some(old) => merge(old, value),
                    None => {
                        values.insert(key, value);
                    }
                }
            }
        }
        (values, extra) => *values = extra,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn extra_values_merge_key_by_key() {
        let mut values = json!({"agent": {"image": "a", "mpsHost": {"enabled": true}}, "x": [1]});
        super::merge(
            &mut values,
            json!({"agent": {"mpsHost": {"shmSizeMiB": 16}}, "x": [2], "y": null}),
        );
        assert_eq!(
            values,
            json!({"agent": {"image": "a", "mpsHost": {"enabled": true, "shmSizeMiB": 16}}, "x": [2], "y": null})
        );
    }
}
