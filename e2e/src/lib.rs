//! A real, isolated Kubernetes control plane for Tessera's tests.
//!
//! [`ControlPlane::start`] runs etcd and kube-apiserver (v1.36, built from the
//! Kubernetes Go modules by `hack/tools.sh`) on free loopback ports with their
//! own certificates, token and kubeconfig, waits until the API server is ready
//! and installs Tessera's CRDs. kube-scheduler and kube-controller-manager can
//! be added with [`ControlPlane::start_scheduler`] and
//! [`ControlPlane::start_controller_manager`].
//!
//! Nothing leaks: dropping the control plane (also while a test panics) stops
//! every process and removes its directory, and every process dies with the
//! test process even when that is killed (see [`process`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tessera_e2e::Error> {
//! let cluster = tessera_e2e::ControlPlane::start().await?;
//! let client = cluster.client().await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod artifacts;
pub mod chaos;
pub mod cluster;
mod components;
mod control_plane;
mod error;
pub mod fault_proxy;
pub mod helm;
pub mod http;
pub mod images;
pub mod jaeger;
pub mod kube_proxy;
mod kubeconfig;
pub mod kubelet;
pub mod kueue;
mod kwok;
pub mod mock_vendor;
mod net;
pub mod node;
pub mod oci;
pub mod pki;
mod pods;
pub mod process;
pub mod prometheus;
pub mod stack;
pub mod testkit;
pub mod tools;
pub mod watchdog;

pub use control_plane::{ControlPlane, Options, remove_stale_dirs};
pub use error::Error;
pub use kwok::ANNOTATION as KWOK_ANNOTATION;
pub use net::{free_port, host_ip};
pub use process::Lifetime;

use std::path::Path;

/// One control plane per test process, started on first use and shared by
/// every test in the binary (each test uses its own object names).
///
/// It is never dropped: its processes die with the test process (they are
/// [`Lifetime::Tied`]) and its directory is removed by the next harness run.
pub async fn shared() -> Result<&'static ControlPlane, Error> {
    static SHARED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_try_init(async || {
            let mut plane = ControlPlane::start().await?;
            // Shared by every test of the binary: no single test's deadline.
            plane.disarm_watchdog();
            Ok(plane)
        })
        .await
}

/// Stops a control plane started with [`Lifetime::Detached`] and removes its
/// directory. Returns the names of the processes that were still running.
pub fn stop_detached(dir: &Path) -> Result<Vec<String>, Error> {
    let path = dir.join(control_plane::STATE_FILE);
    let mut stopped = Vec::new();
    if let Ok(json) = std::fs::read_to_string(&path) {
        let state: control_plane::DetachedState = serde_json::from_str(&json)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        for (name, pid) in state.processes.iter().rev() {
            if process::stop_detached(*pid, name) {
                stopped.push(name.clone());
            }
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(Error::io("remove", dir))?;
    }
    Ok(stopped)
}
