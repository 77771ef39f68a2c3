//! kube-proxy on this machine: routes Service addresses (the `kubernetes`
//! Service to the API server, Tessera's webhook Service to its pods) with
//! iptables, as on a real node.
//!
//! Every real node of the harness shares the host's network namespace (pods
//! sit on per-node bridges), so one kube-proxy serves them all. It owns the
//! host's `KUBE-*` iptables chains: a second local cluster with its own
//! kube-proxy would rewrite them, so a lock file refuses it with a clear
//! error. Stopping it runs `kube-proxy --cleanup`, which removes the chains.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{control_plane::ControlPlane, error::Error, net::free_port, process::Process, tools};

/// The lock naming the kube-proxy process that owns the host's chains.
const LOCK: &str = "/run/tessera-kube-proxy.pid";

/// A running kube-proxy; dropping it stops it and removes its rules.
#[derive(Debug)]
pub struct KubeProxy {
    process: Option<Process>,
}

impl ControlPlane {
    /// Starts kube-proxy (iptables mode) for pods in `cluster_cidr`, as the
    /// proxy of the registered Node `node`, and waits until it is healthy.
    pub async fn start_kube_proxy(
        &self,
        cluster_cidr: &str,
        node: &str,
    ) -> Result<KubeProxy, Error> {
        claim_lock()?;
        let [healthz, metrics] = [free_port()?, free_port()?];
        let config = self.dir.join("kube-proxy.yaml");
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
             kind: KubeProxyConfiguration\n\
             clientConnection:\n  kubeconfig: {kubeconfig}\n\
             mode: iptables\n\
             clusterCIDR: {cluster_cidr}\n\
             hostnameOverride: {node}\n\
             bindAddress: 127.0.0.1\n\
             healthzBindAddress: 127.0.0.1:{healthz}\n\
             metricsBindAddress: 127.0.0.1:{metrics}\n\
             # Leave the host's conntrack table sizes alone.\n\
             conntrack:\n  maxPerCore: 0\n  min: 0\n\
             iptables:\n  syncPeriod: 5s\n  minSyncPeriod: 0s\n",
            kubeconfig = self.kubeconfig().display()
        );
        fs::write(&config, text).map_err(Error::io("write", &config))?;
        let process = Process::spawn(
            "kube-proxy",
            &tools::binary("kube-proxy")?,
            &[format!("--config={}", config.display()), "--v=1".to_owned()],
            self.dir.join("kube-proxy.log"),
            self.lifetime,
        )?;
        let lock = PathBuf::from(LOCK);
        fs::write(&lock, process.pid().to_string()).map_err(Error::io("write", &lock))?;
        let mut proxy = KubeProxy {
            process: Some(process),
        };
        let addr = format!("127.0.0.1:{healthz}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !crate::http::get_ok(&addr, "/healthz").await {
            if let Some(process) = proxy.process.as_mut() {
                process.check_running()?;
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "kube-proxy /healthz".into(),
                    seconds: 60,
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Ok(proxy)
    }
}

impl KubeProxy {
    /// Leaves kube-proxy running (`make demo`); [`cleanup`] undoes it.
    pub fn detach(mut self) -> Option<u32> {
        self.process.take().map(Process::release)
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop();
            cleanup();
        }
    }
}

/// Stops a detached kube-proxy (the one the lock names) and removes its
/// rules (`kube-proxy --cleanup`) and the lock.
pub fn cleanup() {
    if let Ok(text) = fs::read_to_string(Path::new(LOCK))
        && let Ok(pid) = text.trim().parse::<u32>()
    {
        crate::process::stop_detached(pid, "kube-proxy");
    }
    if let Ok(binary) = tools::binary("kube-proxy") {
        let _ = Command::new(binary).arg("--cleanup").output();
    }
    let _ = fs::remove_file(LOCK);
}

/// Fails when another local cluster's kube-proxy still runs.
fn claim_lock() -> Result<(), Error> {
    if let Ok(text) = fs::read_to_string(Path::new(LOCK))
        && let Ok(pid) = text.trim().parse::<u32>()
        && crate::process::is_alive(pid)
    {
        return Err(Error::Config(format!(
            "another local cluster's kube-proxy (pid {pid}, {LOCK}) owns this machine's \
             service rules; stop that cluster first (make demo-down)"
        )));
    }
    Ok(())
}
