//! An isolated etcd + kube-apiserver on free loopback ports.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, Config,
    api::{Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::wait::{await_condition, conditions},
};
use serde::{Deserialize, Serialize};

use crate::{
    error::Error,
    kubeconfig,
    net::{free_ports, host_ip},
    pki::Pki,
    process::{Lifetime, Process},
    tools,
    watchdog::Watchdog,
};

/// How long kube-apiserver may take to become ready (2 slow cores, parallel tests).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Attempts at starting, in case a free port was taken between picking and binding.
const START_ATTEMPTS: u32 = 3;
/// File in a detached cluster's directory that records its processes.
pub(crate) const STATE_FILE: &str = "cluster.json";

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where state, logs and the kubeconfig go; `None`: a fresh directory
    /// under the system temp dir, removed on drop.
    pub dir: Option<PathBuf>,
    /// Whether the processes outlive this process (`make cluster`).
    pub lifetime: Lifetime,
    /// Install Tessera's CRDs and wait until they are Established.
    pub install_crds: bool,
    /// Serve pods as a real cluster does: the API server listens on every
    /// address and advertises the host's, so the `kubernetes` Service (routed
    /// by [`ControlPlane::start_kube_proxy`]) reaches it from pod networks, and
    /// the ServiceAccount admission plugin gives pods their tokens (needs
    /// kube-controller-manager for the `default` accounts and `kube-root-ca.crt`).
    pub serve_pods: bool,
    /// Further kube-apiserver flags, e.g. `--runtime-config=resource.k8s.io/v1=false`
    /// for a cluster that serves no DRA, as before Kubernetes 1.34.
    pub apiserver_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            dir: None,
            lifetime: Lifetime::Tied,
            install_crds: true,
            serve_pods: false,
            apiserver_args: Vec::new(),
        }
    }
}

/// A running etcd and kube-apiserver, plus any components started on them.
///
/// Dropping it stops every process (newest first) and removes its temporary
/// directory. Processes are also tied to the test process, so nothing leaks
/// even when the test process is killed.
#[derive(Debug)]
pub struct ControlPlane {
    pub(crate) dir: PathBuf,
    remove_dir: bool,
    pub(crate) pki: Pki,
    server: String,
    kubeconfig: PathBuf,
    pub(crate) lifetime: Lifetime,
    pub(crate) processes: Mutex<Vec<Process>>,
    /// The test's deadline (tied control planes only); dropped after the
    /// processes are stopped, so a hang while stopping is caught too.
    watchdog: Option<Watchdog>,
}

/// What `tessera-cluster down` needs to stop a detached cluster.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct DetachedState {
    pub(crate) server: String,
    pub(crate) processes: Vec<(String, u32)>,
}

impl ControlPlane {
    /// Starts a control plane in a temporary directory with the CRDs installed.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with(Options::default()).await
    }

    /// Starts a control plane as `options` say.
    pub async fn start_with(options: Options) -> Result<Self, Error> {
        let bin = tools::bin_dir()?;
        let mut attempt = 1;
        loop {
            let (dir, remove_dir) = match &options.dir {
                Some(dir) => (dir.clone(), false),
                None => (fresh_temp_dir()?, true),
            };
            match Self::start_once(&bin, dir, remove_dir, &options).await {
                Ok(plane) => {
                    if options.install_crds {
                        plane.install_crds().await?;
                    }
                    return Ok(plane);
                }
                Err(error) if attempt < START_ATTEMPTS => {
                    tracing::warn!(%error, attempt, "control plane did not start; retrying on new ports");
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn start_once(
        bin: &Path,
        dir: PathBuf,
        remove_dir: bool,
        options: &Options,
    ) -> Result<Self, Error> {
        let (lifetime, serve_pods) = (options.lifetime, options.serve_pods);
        fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
        let pki = Pki::create(&dir)?;
        let [etcd_client, etcd_peer, apiserver_port] = free_ports::<3>()?;
        let server = format!("https://127.0.0.1:{apiserver_port}");
        let kubeconfig = dir.join("kubeconfig");
        kubeconfig::write(&kubeconfig, &server, &pki)?;
        let watchdog = (lifetime == Lifetime::Tied)
            .then(|| Watchdog::arm(&format!("component logs kept in {}", dir.display())));
        let plane = Self {
            dir,
            remove_dir,
            pki,
            server,
            kubeconfig,
            lifetime,
            processes: Mutex::new(Vec::new()),
            watchdog,
        };

        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd_args = vec![
            "--name=tessera".to_owned(),
            format!("--data-dir={}", plane.dir.join("etcd").display()),
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=tessera={peer_url}"),
        ];
        plane.spawn("etcd", &bin.join("etcd"), &etcd_args)?;

        let pki = &plane.pki;
        let path = |p: &Path| p.display().to_string();
        let (bind, advertise) = if serve_pods {
            ("0.0.0.0".to_owned(), host_ip()?)
        } else {
            ("127.0.0.1".to_owned(), "127.0.0.1".to_owned())
        };
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--bind-address={bind}"),
            format!("--advertise-address={advertise}"),
            format!("--secure-port={apiserver_port}"),
            format!("--tls-cert-file={}", path(&pki.apiserver_cert)),
            format!("--tls-private-key-file={}", path(&pki.apiserver_key)),
            format!("--client-ca-file={}", path(&pki.ca_cert)),
            format!("--service-account-issuer=https://127.0.0.1:{apiserver_port}"),
            format!("--service-account-key-file={}", path(&pki.sa_pub)),
            format!("--service-account-signing-key-file={}", path(&pki.sa_key)),
            "--service-cluster-ip-range=10.96.0.0/16".to_owned(),
            "--allow-privileged=true".to_owned(),
            format!("--token-auth-file={}", path(&pki.tokens)),
            "--authorization-mode=RBAC".to_owned(),
            "--enable-priority-and-fairness=false".to_owned(),
            "--max-requests-inflight=0".to_owned(),
            "--max-mutating-requests-inflight=0".to_owned(),
            "--profiling=false".to_owned(),
            // Real nodes (issue 6) share one host name; reach kubelets by IP.
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
            "--v=1".to_owned(),
        ];
        if serve_pods {
            // The `kubernetes` Service's endpoint: this API server.
            apiserver_args.push("--endpoint-reconciler-type=lease".to_owned());
            apiserver_args.push("--disable-admission-plugins=TaintNodesByCondition".to_owned());
        } else {
            // No kubelet creates service-account token volumes here and no
            // node-lifecycle controller lifts the not-ready taint from nodes.
            apiserver_args.push(
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".to_owned(),
            );
            apiserver_args.push("--endpoint-reconciler-type=none".to_owned());
        }
        apiserver_args.extend(options.apiserver_args.iter().cloned());
        plane.spawn(
            "kube-apiserver",
            &tools::binary("kube-apiserver")?,
            &apiserver_args,
        )?;
        plane.wait_ready("kube-apiserver /readyz", None).await?;
        Ok(plane)
    }

    /// Removes this control plane's deadline (one shared by many tests).
    pub fn disarm_watchdog(&mut self) {
        self.watchdog = None;
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding state, logs and credentials.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Certificates and tokens, including a serving certificate for
    /// 127.0.0.1 that Tessera's webhook and extender can use.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// An admin client.
    pub async fn client(&self) -> Result<Client, Error> {
        Ok(Client::try_from(self.client_config().await?)?)
    }

    /// The admin client configuration.
    pub async fn client_config(&self) -> Result<Config, Error> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// An admin client whose connections go through a TCP proxy that stops
    /// forwarding, holding every connection open, while the returned
    /// sender says `true`: requests through it then hang, as they do when
    /// the API server is overloaded or a network partition drops packets.
    pub async fn freezable_client(
        &self,
    ) -> Result<(Client, tokio::sync::watch::Sender<bool>), Error> {
        let mut config = self.client_config().await?;
        let host = config.cluster_url.host().unwrap_or("127.0.0.1").to_owned();
        let port = config.cluster_url.port_u16().unwrap_or(443);
        let upstream = format!("{host}:{port}");
        let (freeze, frozen) = tokio::sync::watch::channel(false);
        let proxy = crate::net::freezable_proxy(upstream, frozen).await?;
        config.cluster_url = format!("https://{host}:{proxy}")
            .parse()
            .map_err(|e| Error::Config(format!("the proxy's address: {e}")))?;
        Ok((Client::try_from(config)?, freeze))
    }

    /// A `kubectl` command (the v1.36 build) pointed at this control plane.
    pub fn kubectl(&self) -> Result<std::process::Command, Error> {
        let mut command = std::process::Command::new(tools::binary("kubectl")?);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        Ok(command)
    }

    /// What `kubectl logs -n <namespace> <pod>` prints on stdout (empty
    /// while the container has not started).
    pub fn logs(&self, namespace: &str, pod: &str) -> Result<String, Error> {
        let output = self
            .kubectl()?
            .args(["logs", "-n", namespace, pod])
            .output()
            .map_err(Error::io("run kubectl logs", "kubectl"))?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Applies Tessera's CRDs (server-side apply) and waits until every one is Established.
    pub async fn install_crds(&self) -> Result<(), Error> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await?);
        let params = PatchParams::apply("tessera-e2e").force();
        let crds = tessera_api::crds::all();
        for crd in &crds {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            api.patch(name, &params, &Patch::Apply(crd)).await?;
        }
        for crd in &crds {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            let established = await_condition(api.clone(), name, conditions::is_crd_established());
            tokio::time::timeout(READY_TIMEOUT, established)
                .await
                .map_err(|_| Error::Timeout {
                    what: format!("CRD {name} to become Established"),
                    seconds: READY_TIMEOUT.as_secs(),
                })?
                .map_err(|e| Error::Config(format!("watching CRD {name}: {e}")))?;
        }
        Ok(())
    }

    /// Makes a process started elsewhere a component: stopped with the
    /// control plane, and recorded when it is detached.
    pub fn adopt(&self, process: Process) {
        self.processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(process);
    }

    /// Stops the named component (newest instance) if it runs.
    pub fn stop_component(&self, name: &str) {
        let mut processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = processes.iter().rposition(|p| p.name() == name) {
            processes.remove(i).stop();
        }
    }

    /// Kills the named component (newest instance) with SIGKILL and starts
    /// it again as it was started; for kube-apiserver, waits until it is
    /// ready again. Chaos tests use it on etcd and kube-apiserver.
    pub async fn kill_and_restart(&self, name: &str) -> Result<(), Error> {
        {
            let mut processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
            let i = processes
                .iter()
                .rposition(|p| p.name() == name)
                .ok_or_else(|| Error::Config(format!("no component {name} runs")))?;
            processes[i].kill();
            let again = processes[i].respawn()?;
            processes[i] = again;
        }
        if name == "kube-apiserver" {
            self.wait_ready("kube-apiserver /readyz", None).await?;
        }
        Ok(())
    }

    /// Pids of every running component, oldest first.
    pub fn pids(&self) -> Vec<(String, u32)> {
        let processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        processes
            .iter()
            .map(|p| (p.name().to_owned(), p.pid()))
            .collect()
    }

    /// Leaves a detached control plane running: records its processes in
    /// `<dir>/cluster.json` for [`crate::stop_detached`] and forgets them.
    pub fn detach(mut self) -> Result<PathBuf, Error> {
        let processes = std::mem::take(self.processes.get_mut().unwrap_or_else(|e| e.into_inner()));
        let state = DetachedState {
            server: self.server.clone(),
            processes: processes
                .into_iter()
                .map(|p| (p.name().to_owned(), p.release()))
                .collect(),
        };
        let path = self.dir.join(STATE_FILE);
        let json =
            serde_json::to_string_pretty(&state).map_err(|e| Error::Config(e.to_string()))?;
        fs::write(&path, json).map_err(Error::io("write", &path))?;
        self.remove_dir = false;
        Ok(self.dir.clone())
    }

    pub(crate) fn spawn(&self, name: &str, program: &Path, args: &[String]) -> Result<(), Error> {
        let log = self.dir.join(format!("{name}.log"));
        let process = Process::spawn(name, program, args, log, self.lifetime)?;
        self.processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(process);
        Ok(())
    }

    /// Polls `GET <url or apiserver>/<path>` until it answers 200, failing
    /// early with the log of any component that exits meanwhile.
    pub(crate) async fn wait_ready(
        &self,
        what: &str,
        endpoint: Option<(&str, &str)>,
    ) -> Result<(), Error> {
        let mut config = self.client_config().await?;
        let path = match endpoint {
            Some((url, path)) => {
                config.cluster_url = url
                    .parse()
                    .map_err(|e| Error::Config(format!("{url}: {e}")))?;
                path
            }
            None => "/readyz",
        };
        config.connect_timeout = Some(Duration::from_secs(2));
        config.read_timeout = Some(Duration::from_secs(5));
        let client = Client::try_from(config)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_running()?;
            let request = http::Request::get(path)
                .body(Vec::new())
                .map_err(|e| Error::Config(e.to_string()))?;
            if let Ok(body) = client.request_text(request).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    seconds: READY_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Fails with the log of any component that has exited.
    pub fn check_running(&self) -> Result<(), Error> {
        let mut processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        processes.iter_mut().try_for_each(Process::check_running)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let processes = self.processes.get_mut().unwrap_or_else(|e| e.into_inner());
        while let Some(mut process) = processes.pop() {
            process.stop();
        }
        if self.remove_dir {
            let _ = fs::remove_dir_all(&self.dir);
        }
        // The test is not over until its runtime has shut down.
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.until_thread_exit();
        }
    }
}

impl crate::node::ControlPlaneView for ControlPlane {
    fn dir(&self) -> &Path {
        ControlPlane::dir(self)
    }

    fn kubeconfig(&self) -> &Path {
        ControlPlane::kubeconfig(self)
    }

    fn lifetime(&self) -> Lifetime {
        self.lifetime
    }

    async fn client(&self) -> Result<Client, Error> {
        ControlPlane::client(self).await
    }
}

/// Where temporary control planes live: `<tmp>/tessera-e2e/<pid>-<n>`.
fn temp_root() -> PathBuf {
    std::env::temp_dir().join("tessera-e2e")
}

/// Removes temporary control-plane directories whose test process is gone
/// (a process killed outright cannot clean up after itself), stopping what
/// their real nodes left running.
pub fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir(temp_root()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if owner.is_some_and(|pid| !crate::process::is_alive(pid)) {
            // Real nodes leave containers, cgroups and bridges that die with
            // nothing; stop them before their directories go.
            if let Ok(nodes) = fs::read_dir(entry.path().join("nodes")) {
                for node in nodes.flatten() {
                    let _ = crate::node::stop_detached(&node.path());
                }
            }
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A new temporary directory, after sweeping stale ones.
fn fresh_temp_dir() -> Result<PathBuf, Error> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    remove_stale_dirs();
    let root = temp_root();
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
    Ok(dir)
}
