//! The agent's view of its own node in the cluster, from node-scoped
//! watches only: its Node (labels), the GpuNodeConfigs, the VgpuAllocations
//! of this node (field selector `spec.nodeName`; all of them on an API
//! server before 1.31, which serves no field selector on custom resources),
//! and nothing that grows with the cluster's pods. Allocate reads the node's NodeLock and the
//! holder's VgpuAllocation straight from the API server (a cache could still
//! show the lock of the pod served a moment ago).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    runtime::{reflector, watcher},
};
use tessera_api::v1alpha1::{DeviceFamily, GpuNodeConfig, NodeLock, VgpuAllocation};
use tessera_kubekit::Watch;
use tokio::sync::watch;

use crate::Error;

/// Watches of the node and the configs, and reads for Allocate.
#[derive(Clone)]
pub struct NodeView {
    client: Client,
    node: String,
    nodes: reflector::Store<Node>,
    configs: reflector::Store<GpuNodeConfig>,
    allocations: reflector::Store<VgpuAllocation>,
    changed: watch::Receiver<u64>,
}

impl NodeView {
    /// Starts the watches of `node` and of every GpuNodeConfig. The node's
    /// allocations are watched by field selector where the API server
    /// serves one on VgpuAllocations (`by_field`, Kubernetes 1.31 and
    /// later); otherwise all of them are, and [`NodeView::allocations`]
    /// keeps the node's.
    pub fn spawn(client: Client, node: &str, by_field: bool) -> Self {
        // One signal for all: the offer depends on the node, the configs and
        // (for MIG instance holders) the allocations.
        let changed = watch::channel(0u64).0;
        let by_name = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let nodes = Watch::new(Api::<Node>::all(client.clone()), by_name)
            .signal(&changed)
            .spawn();
        let configs = Watch::new(
            Api::<GpuNodeConfig>::all(client.clone()),
            watcher::Config::default(),
        )
        .signal(&changed)
        .spawn();
        let on_node_only = if by_field {
            watcher::Config::default().fields(&format!("spec.nodeName={node}"))
        } else {
            watcher::Config::default()
        };
        // The offer names the allocation holding each MIG instance.
        let allocations = Watch::new(Api::<VgpuAllocation>::all(client.clone()), on_node_only)
            .signal(&changed)
            .spawn();
        Self {
            client,
            node: node.to_owned(),
            nodes: nodes.store(),
            configs: configs.store(),
            allocations: allocations.store(),
            changed: changed.subscribe(),
        }
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The API client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Waits until the watches have listed once.
    pub async fn ready(&self) {
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.configs.wait_until_ready().await;
        let _ = self.allocations.wait_until_ready().await;
    }

    /// The Node object, once seen.
    pub fn node_object(&self) -> Option<Node> {
        self.nodes.state().first().map(|n| (**n).clone())
    }

    /// Every GpuNodeConfig.
    pub fn configs(&self) -> Vec<GpuNodeConfig> {
        self.configs.state().iter().map(|c| (**c).clone()).collect()
    }

    /// The VgpuAllocations of this node's NVIDIA GPUs, as last seen. On a
    /// node where another vendor's plugin also serves devices, the
    /// allocations of those are the plugin's business (docs/vendors.md,
    /// mixed nodes): they hold nothing of the agent's GPUs, and counting
    /// them would keep a front-door switch or a drain waiting for pods it
    /// does not serve.
    pub fn allocations(&self) -> Vec<VgpuAllocation> {
        self.allocations
            .state()
            .iter()
            .filter(|a| a.spec.node_name == self.node && a.has_family(DeviceFamily::Nvidia))
            .map(|a| (**a).clone())
            .collect()
    }

    /// Every VgpuAllocation of this node, of any device family, as last seen:
    /// for decisions about the ledger itself (which allocation holds a
    /// pod's name), where another vendor's allocation counts as much as one
    /// of the agent's GPUs.
    pub fn node_allocations(&self) -> Vec<VgpuAllocation> {
        self.allocations
            .state()
            .iter()
            .filter(|a| a.spec.node_name == self.node)
            .map(|a| (**a).clone())
            .collect()
    }

    /// A receiver that wakes when the node, any config or any of the node's
    /// allocations changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.clone()
    }

    /// The node's NodeLock, if any.
    pub async fn lock(&self) -> Result<Option<NodeLock>, Error> {
        let api = Api::<NodeLock>::all(self.client.clone());
        through_outages(OUTAGE_PATIENCE, || api.get_opt(&self.node))
            .await
            .map_err(Error::kube(format!("reading NodeLock {}", self.node)))
    }

    /// The node's NodeLock, if any, read once: for advice that must not wait
    /// through an outage.
    pub async fn lock_once(&self) -> Result<Option<NodeLock>, Error> {
        Api::<NodeLock>::all(self.client.clone())
            .get_opt(&self.node)
            .await
            .map_err(Error::kube(format!("reading NodeLock {}", self.node)))
    }

    /// The allocation a lock names: from the node-scoped watch when it has
    /// the holder's (the spec never changes), else from the API server.
    pub async fn allocation(&self, lock: &NodeLock) -> Result<Option<VgpuAllocation>, Error> {
        let key =
            reflector::ObjectRef::new(&lock.spec.allocation).within(&lock.spec.holder.namespace);
        if let Some(cached) = self.allocations.get(&key)
            && cached.spec.pod_uid == lock.spec.holder.uid
        {
            return Ok(Some((*cached).clone()));
        }
        self.allocation_from_api(lock).await
    }

    /// The pod a lock names (`None`: not found), read from the API server.
    pub async fn holder_pod(&self, lock: &NodeLock) -> Result<Option<Pod>, Error> {
        let holder = &lock.spec.holder;
        let api = Api::<Pod>::namespaced(self.client.clone(), &holder.namespace);
        through_outages(OUTAGE_PATIENCE, || api.get_opt(&holder.name))
            .await
            .map_err(Error::kube(format!(
                "reading pod {}/{}, the holder of NodeLock {}",
                holder.namespace, holder.name, self.node
            )))
    }

    /// The allocation a lock names, read from the API server.
    pub async fn allocation_from_api(
        &self,
        lock: &NodeLock,
    ) -> Result<Option<VgpuAllocation>, Error> {
        let api =
            Api::<VgpuAllocation>::namespaced(self.client.clone(), &lock.spec.holder.namespace);
        through_outages(OUTAGE_PATIENCE, || api.get_opt(&lock.spec.allocation))
            .await
            .map_err(Error::kube(format!(
                "reading VgpuAllocation {}/{}",
                lock.spec.holder.namespace, lock.spec.allocation
            )))
    }
}

/// How long a read Allocate depends on is retried while the API server is
/// unreachable or overloaded: a kube-apiserver restart takes a few seconds,
/// and an Allocate that fails loses its pod for good (the kubelet rejects it
/// at admission).
const OUTAGE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `read` again, every 200 ms for up to `patience`, while it
/// fails in a way that passes (no connection, 5xx, 429); any other error
/// and the last one are returned.
async fn through_outages<T, F: Future<Output = Result<T, kube::Error>>>(
    patience: std::time::Duration,
    mut read: impl FnMut() -> F,
) -> Result<T, kube::Error> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match read().await {
            Err(error) if transient(&error) && tokio::time::Instant::now() < deadline => {
                tracing::warn!(%error, "the API server is unreachable; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            result => return result,
        }
    }
}

/// Whether an error is the API server being away rather than an answer.
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(
            serde_json::json!({"status": "Failure", "code": code, "message": "m", "reason": "r"}),
        )
        .unwrap();
        kube::Error::Api(Box::new(status))
    }

    #[tokio::test]
    async fn reads_wait_out_an_api_server_restart_but_not_an_answer() {
        let mut calls = 0;
        let patience = std::time::Duration::from_secs(5);
        let result = through_outages(patience, || {
            calls += 1;
            let answer = if calls < 4 {
                Err(api_error(503))
            } else {
                Ok(calls)
            };
            async move { answer }
        })
        .await;
        assert_eq!(result.unwrap(), 4, "retried through three 503s");

        let mut calls = 0;
        let result: Result<(), _> = through_outages(patience, || {
            calls += 1;
            async { Err(api_error(403)) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 1, "a refusal is an answer, not an outage");

        let mut calls = 0u32;
        let short = std::time::Duration::from_millis(500);
        let result: Result<(), _> = through_outages(short, || {
            calls += 1;
            async { Err(api_error(429)) }
        })
        .await;
        assert!(result.is_err(), "gives up after its patience");
        assert!((2..=4).contains(&calls), "every 200 ms for 500 ms: {calls}");
    }
}
