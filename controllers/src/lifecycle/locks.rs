//! Locks: a NodeLock is deleted as soon as its holder is deleted, finished,
//! bound elsewhere, or served, and at its expiry otherwise.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Preconditions},
    runtime::{Controller, controller::Action, reflector::ObjectRef},
};
use tessera_api::v1alpha1::NodeLock;
use tessera_kubekit::Watched;

use super::{Caches, LockAction, lock_action, retry_cached};
use crate::Error;

/// Runs the controller on `locks`, woken by their holders' `pods` and by
/// the allocations.
pub(super) async fn run(caches: Arc<Caches>, locks: &Watched<NodeLock>, pods: &Watched<Pod>) {
    let by_holder = {
        let locks = locks.store();
        move |pod: Pod| {
            let uid = pod.metadata.uid.unwrap_or_default();
            locks
                .state()
                .into_iter()
                .filter(|lock| lock.spec.holder.uid == uid)
                .map(|lock| ObjectRef::from_obj(&*lock))
                .collect::<Vec<_>>()
        }
    };
    Controller::for_stream(locks.touched(), locks.store())
        .watches_stream(pods.touched(), by_holder)
        .watches_stream(caches.allocations.touched(), |a| {
            Some(ObjectRef::<NodeLock>::new(&a.spec.node_name))
        })
        .run(reconcile_lock, retry_cached, caches)
        .for_each(|_| async {})
        .await;
}

/// NodeLock incarnations (UIDs) this replica released lately. The store
/// shows a deleted lock until the watch reports the deletion, and each event
/// of its holder or allocation meanwhile would delete it again: a 404 for
/// every other GPU pod of a burst.
#[derive(Debug, Default)]
pub(super) struct Released(std::sync::Mutex<std::collections::VecDeque<String>>);

impl Released {
    /// How many UIDs are remembered.
    const KEPT: usize = 1024;

    fn contains(&self, uid: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|u| u == uid)
    }

    fn add(&self, uid: String) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.push_back(uid);
        if kept.len() > Self::KEPT {
            kept.pop_front();
        }
    }
}

async fn reconcile_lock(lock: Arc<NodeLock>, caches: Arc<Caches>) -> Result<Action, Error> {
    let uid = lock.metadata.uid.clone().unwrap_or_default();
    if caches.released_locks.contains(&uid) {
        return Ok(Action::await_change());
    }
    let holder = &lock.spec.holder;
    let pod = caches
        .pod(&holder.namespace, &holder.name, &holder.uid)
        .await?;
    let allocation = caches
        .allocations
        .store()
        .get(&ObjectRef::new(&lock.spec.allocation).within(&holder.namespace));
    match lock_action(&lock, pod.as_ref(), allocation.as_deref(), Timestamp::now()) {
        LockAction::Release(reason) => {
            let locks: Api<NodeLock> = Api::all(caches.client.clone());
            let only_this = DeleteParams::default().preconditions(Preconditions {
                uid: lock.metadata.uid.clone(),
                resource_version: None,
            });
            match locks.delete(&lock.name_any(), &only_this).await {
                Ok(_) => {
                    tracing::info!(node = %lock.name_any(), holder = %holder.name, %reason, "released NodeLock")
                }
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => return Err(Error::kube("releasing the NodeLock")(e)),
            }
            caches.released_locks.add(uid);
            Ok(Action::await_change())
        }
        LockAction::KeepUntil(expiry) => {
            let wait = expiry.duration_since(Timestamp::now()).unsigned_abs();
            Ok(Action::requeue(wait + Duration::from_millis(100)))
        }
    }
}
