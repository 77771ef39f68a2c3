//! What the lifecycle reconcilers share: the cached objects they decide
//! from, the locks released lately, and how a failed reconcile retries.

use std::{sync::Arc, time::Duration};

use kube::{
    Api, Client,
    runtime::{
        controller::Action,
        reflector::{ObjectRef, Store},
    },
};
use tessera_api::v1alpha1::VgpuAllocation;
use tessera_kubekit::Watched;

use crate::{Error, cache::Cache, lean_pod::LeanPod};

/// How long a failed reconcile waits before trying again.
pub(super) const RETRY: Duration = Duration::from_secs(5);

/// The cached objects a reconciler decides from: no API read per reconcile.
pub(super) struct Caches {
    pub(super) client: Client,
    pub(super) pods: Store<LeanPod>,
    pub(super) allocations: Watched<VgpuAllocation>,
    /// Locks released lately (see [`Released`]).
    pub(super) released_locks: Released,
}

impl Caches {
    /// Waits until the pods, allocations and locks have been listed once.
    /// Reconciling earlier finds pods missing from the cache and asks the
    /// API server for each (at 1,000 nodes a start read 8,000 pods one by
    /// one while the first list was still coming).
    pub(super) async fn wait_listed(&self, cache: &Cache) {
        let _ = self.pods.wait_until_ready().await;
        let _ = self.allocations.store().wait_until_ready().await;
        let _ = cache.locks().store().wait_until_ready().await;
    }

    /// The pod `namespace/name` from the cache; when the cache has no such
    /// pod (or another incarnation), the API server confirms before anyone
    /// acts on "the pod is gone".
    pub(super) async fn pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<LeanPod>, Error> {
        let cached = self.pods.get(&ObjectRef::new(name).within(namespace));
        if let Some(pod) = cached.filter(|p| p.metadata.uid.as_deref() == Some(uid)) {
            return Ok(Some((*pod).clone()));
        }
        Api::<LeanPod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(Error::kube("reading the pod"))
    }
}

pub(super) fn retry_cached<K>(_: Arc<K>, error: &Error, _: Arc<Caches>) -> Action {
    tracing::warn!(%error, "reconcile failed; retrying");
    Action::requeue(RETRY)
}

/// NodeLock versions (`uid@resourceVersion`) this replica released lately. The store
/// shows a deleted lock until the watch reports the deletion, and each event
/// of its holder or allocation meanwhile would delete it again: a 404 for
/// every other GPU pod of a burst.
#[derive(Debug, Default)]
pub(super) struct Released(std::sync::Mutex<std::collections::VecDeque<String>>);

impl Released {
    /// How many versions are remembered.
    const KEPT: usize = 1024;

    pub(super) fn contains(&self, uid: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|u| u == uid)
    }

    pub(super) fn add(&self, uid: String) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.push_back(uid);
        if kept.len() > Self::KEPT {
            kept.pop_front();
        }
    }
}
