//! The pods of a run: what a GPU pod and a plain pod look like, and
//! creating many at once.

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{Api, Client, api::PostParams};
use serde_json::{Value, json};

use crate::Error;

/// The namespace every pod of a run lives in.
pub const NAMESPACE: &str = "tessera-bench";
/// The label saying which part of the run a pod belongs to.
pub const ROLE: &str = "tessera.dev/bench-role";
/// Requests in flight while creating pods.
pub const CONCURRENCY: usize = 32;

/// What a GPU pod's one container asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuAsk {
    /// `nvidia.com/gpumem` (MiB).
    pub memory_mib: u64,
    /// `nvidia.com/gpucores` (% of SMs).
    pub cores: u32,
}

/// A pod named `name` with role `role`: a GPU pod (one GPU, `ask`) when
/// `ask` is given, else a plain pod asking for 10m CPU.
pub fn pod(name: &str, role: &str, ask: Option<GpuAsk>) -> Pod {
    let resources = match ask {
        Some(ask) => json!({"limits": {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": ask.memory_mib.to_string(),
            "nvidia.com/gpucores": ask.cores.to_string(),
        }}),
        None => json!({"requests": {"cpu": "10m"}}),
    };
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {ROLE: role}},
        "spec": {
            "containers": [{"name": "main", "image": "registry.local/cuda-app:v1", "resources": resources}],
            "terminationGracePeriodSeconds": 0,
        },
    }))
    .unwrap_or_default()
}

/// Creates the run's namespace.
pub async fn create_namespace(client: &Client) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let object: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap_or_default();
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(Error::kube("creating the bench namespace")(e)),
    }
}

/// Creates `pods`, [`CONCURRENCY`] at a time; returns them as created.
/// A refusal by the webhook while it starts is retried for up to 30 s.
pub async fn create_all(client: &Client, pods: Vec<Pod>) -> Result<Vec<Pod>, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    stream::iter(pods)
        .map(|pod| {
            let api = api.clone();
            async move { create(&api, &pod).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// Creates one pod, retrying for 30 s while the API server answers 5xx
/// (the webhook is not up yet: `failurePolicy: Fail`; or a create that
/// timed out on a loaded API server but went through, found on the retry).
pub async fn create(api: &Api<Pod>, pod: &Pod) -> Result<Pod, Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut retried = false;
    loop {
        match api.create(&PostParams::default(), pod).await {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(s)) if s.is_already_exists() && retried => {
                return api
                    .get(&name)
                    .await
                    .map_err(Error::kube(format!("reading pod {name}")));
            }
            Err(kube::Error::Api(s)) if s.code >= 500 && std::time::Instant::now() < deadline => {
                retried = true;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => return Err(Error::kube(format!("creating pod {name}"))(e)),
        }
    }
}

/// A pod's `spec.nodeName`, if bound.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The JSON of `pod` as kube-scheduler sends it to the extender after the
/// webhook mutated it (scheduler name set).
pub fn as_scheduled(pod: &Pod) -> Value {
    let mut value = serde_json::to_value(pod).unwrap_or_default();
    value["spec"]["schedulerName"] = json!(tessera_e2e::stack::SCHEDULER_NAME);
    value["metadata"]["uid"] = json!("00000000-0000-4000-8000-00000000beef");
    value
}
