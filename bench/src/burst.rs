//! A burst: many pods created at once, timed until the last is bound.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};

use crate::{
    Error,
    pods::{self, NAMESPACE, ROLE},
};

/// How a burst went.
#[derive(Clone, Debug)]
pub struct Burst {
    /// Pods created.
    pub pods: usize,
    /// From the first create to the last create's answer.
    pub created: Duration,
    /// From the first create to the last binding seen.
    pub elapsed: Duration,
    /// When the last binding was seen.
    pub finished: Instant,
    /// Each bound pod's node.
    pub placed: BTreeMap<String, String>,
}

impl Burst {
    /// How many nodes the pods went to, and the most on one node.
    pub fn spread(&self) -> (usize, usize) {
        let mut per_node = BTreeMap::<&str, usize>::new();
        for node in self.placed.values() {
            *per_node.entry(node).or_default() += 1;
        }
        (
            per_node.len(),
            per_node.values().copied().max().unwrap_or(0),
        )
    }

    /// Pods bound per second.
    pub fn rate(&self) -> f64 {
        self.placed.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Creates `batch` (all labelled with the same role) and waits until every
/// pod is bound, at most `limit`.
pub async fn run(client: &Client, batch: Vec<Pod>, limit: Duration) -> Result<Burst, Error> {
    let role = batch
        .first()
        .and_then(|p| p.labels().get(ROLE).cloned())
        .unwrap_or_default();
    let total = batch.len();
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let config = watcher::Config::default().labels(&format!("{ROLE}={role}"));
    let mut bound = watcher(api, config).applied_objects().boxed();
    // The watch is established before the first pod is created.
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let watching = tokio::spawn(async move {
        let mut placed = BTreeMap::new();
        let mut ready_tx = Some(ready_tx);
        let first = tokio::time::timeout(Duration::from_secs(30), bound.next()).await;
        if let Some(tx) = ready_tx.take() {
            let _ = tx.send(());
        }
        let mut next = first.ok().flatten();
        loop {
            match next {
                Some(Ok(pod)) => {
                    if let Some(node) = pods::node_of(&pod) {
                        placed.insert(pod.name_any(), node.to_owned());
                    }
                }
                Some(Err(error)) => tracing::warn!(%error, "burst watch"),
                None => {}
            }
            if placed.len() >= total {
                return (placed, Instant::now());
            }
            next = bound.next().await;
        }
    });
    // The watcher yields nothing until a pod exists; give it a moment to list.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    pods::create_all(client, batch).await?;
    let created = started.elapsed();
    let _ = ready_rx.await;
    let (placed, done) = tokio::time::timeout(limit, watching)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("{total} pods of burst {role} to be bound"),
            seconds: limit.as_secs(),
        })?
        .map_err(|e| Error::Measure {
            what: format!("burst {role}"),
            why: e.to_string(),
        })?;
    Ok(Burst {
        pods: total,
        created,
        elapsed: done.duration_since(started),
        finished: done,
        placed,
    })
}

/// Waits until `total` pods of burst `role` run (kwok's status write), at
/// most `limit`: a burst's requests are counted until then, so the next
/// burst's window does not carry this one's trailing status writes.
pub async fn wait_running(
    client: &Client,
    role: &str,
    total: usize,
    limit: Duration,
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let config = watcher::Config::default().labels(&format!("{ROLE}={role}"));
    let mut running = std::collections::BTreeSet::new();
    let mut events = watcher(api, config).applied_objects().boxed();
    let all_running = async {
        while running.len() < total {
            match events.next().await {
                Some(Ok(pod)) => {
                    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                    if phase == Some("Running") {
                        running.insert(pod.name_any());
                    }
                }
                Some(Err(error)) => tracing::warn!(%error, "running watch"),
                None => return,
            }
        }
    };
    tokio::time::timeout(limit, all_running)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("{total} pods of burst {role} to run"),
            seconds: limit.as_secs(),
        })
}
