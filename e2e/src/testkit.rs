//! What the real-node tests share: a one-node cluster, pod manifests,
//! reading a probe's output, pod phases and `/metrics` samples.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{Api, Client, api::ListParams};
use tessera_api::v1alpha1::{AllocationPhase, VgpuAllocation};

/// A local cluster (tied to the test) with one real node `name` holding one
/// fake GPU of `model` and `memory_mib`, Tessera not installed yet; and
/// that GPU's UUID.
pub async fn one_gpu_node(
    name: &str,
    model: &str,
    memory_mib: u64,
) -> (crate::cluster::LocalCluster, String) {
    one_gpu_node_with(name, model, memory_mib, serde_json::json!({})).await
}

/// [`one_gpu_node`] with `extra` chart values (see
/// [`crate::cluster::LocalCluster::start_with`]).
pub async fn one_gpu_node_with(
    name: &str,
    model: &str,
    memory_mib: u64,
    extra: serde_json::Value,
) -> (crate::cluster::LocalCluster, String) {
    crate::remove_stale_dirs();
    let artifacts = crate::artifacts::Artifacts::locate().unwrap();
    let gpus = crate::node::FakeGpu::many(name, 1, model, memory_mib, 1);
    let uuid = gpus[0].uuid.clone();
    let nodes = [crate::cluster::NodeGpus {
        name: name.into(),
        gpus,
        ..Default::default()
    }];
    let cluster = crate::cluster::LocalCluster::start_with(
        None,
        crate::process::Lifetime::Tied,
        &nodes,
        &artifacts,
        extra,
    )
    .await
    .unwrap();
    (cluster, uuid)
}

pub use crate::pods::{gpu_pod, pod_with_limits};

/// Polls `check` every 300 ms until it gives a value; panics naming `what`
/// after `limit`.
pub async fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits up to `limit` for the VgpuAllocation `namespace/name` to be
/// Allocated (its containers served); returns it.
pub async fn allocated(
    client: &Client,
    namespace: &str,
    name: &str,
    limit: Duration,
) -> VgpuAllocation {
    let api = Api::<VgpuAllocation>::namespaced(client.clone(), namespace);
    wait_for(
        &format!("{namespace}/{name} Allocated"),
        limit,
        async || {
            let allocation = api.get_opt(name).await.ok()??;
            (allocation.status.as_ref()?.phase? == AllocationPhase::Allocated).then_some(allocation)
        },
    )
    .await
}

/// The message of the scheduler's latest `FailedScheduling` event for the
/// pod `name` in `namespace`, once there is one.
pub async fn scheduling_failure(client: &Client, namespace: &str, name: &str) -> Option<String> {
    let events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .ok()?;
    events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .max_by_key(|e| e.last_timestamp.clone().map(|t| t.0))
        .and_then(|e| e.message)
}

/// Whether the pod's `Ready` condition is true.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod's phase, `""` before it has one.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The `key=value` lines of a probe's output after the line `section`, up
/// to the next `---` line.
pub fn section(output: &str, section: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .skip_while(|l| *l != section)
        .skip(1)
        .take_while(|l| !l.starts_with("---"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The number under `key` in a [`section`], panicking with the section when
/// it is missing or not a number.
pub fn number(values: &BTreeMap<String, String>, key: &str) -> u64 {
    values
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {values:?}"))
}

/// The value of `metric` for the sample whose labels contain `pod="<pod>"`
/// (HAMi v2.9's label; before v2.9 it was `podname`).
pub fn sample(metrics: &str, metric: &str, pod: &str) -> Option<f64> {
    let label = format!(",pod=\"{pod}\"");
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_numbers_and_samples_are_read_exactly() {
        let out = "--- env\nA=1\n--- meminfo\ntotal=1024\nfree=x\n--- alloc\nlast_rc=2\n";
        let meminfo = section(out, "--- meminfo");
        assert_eq!(meminfo.len(), 2);
        assert_eq!(number(&meminfo, "total"), 1024);
        assert!(std::panic::catch_unwind(|| number(&meminfo, "free")).is_err());
        let metrics = "m{node=\"n\",pod=\"a\"} 5\nm{node=\"n\",pod=\"ab\"} 7\n";
        assert_eq!(sample(metrics, "m", "ab"), Some(7.0));
        assert_eq!(sample(metrics, "m", "b"), None);
    }
}
