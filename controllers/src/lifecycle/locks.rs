//! Locks: a NodeLock whose holder was served stays, free, for the node's
//! next pod (the holder's allocation leaving `Bound` released it); one
//! whose holder is deleted, finished or bound elsewhere with no allocation
//! to say so, or that expired unserved, is deleted.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Preconditions},
    runtime::{Controller, controller::Action, reflector::ObjectRef},
};
use tessera_api::v1alpha1::NodeLock;
use tessera_kubekit::Watched;

use super::caches::{Caches, retry_cached};
use crate::{
    Error,
    lean_pod::LeanPod,
    lifecycle_rules::{LockAction, lock_action},
};

/// Runs the controller on `locks`, woken by their holders' `pods` and by
/// the allocations.
pub(super) async fn run(caches: Arc<Caches>, locks: &Watched<NodeLock>, pods: &Watched<LeanPod>) {
    let by_holder = {
        let locks = locks.store();
        move |pod: LeanPod| {
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

async fn reconcile_lock(lock: Arc<NodeLock>, caches: Arc<Caches>) -> Result<Action, Error> {
    // The version judged: a lock is updated in place from holder to holder.
    let version = format!(
        "{}@{}",
        lock.metadata.uid.as_deref().unwrap_or_default(),
        lock.metadata
            .resource_version
            .as_deref()
            .unwrap_or_default()
    );
    if caches.released_locks.contains(&version) {
        return Ok(Action::await_change());
    }
    let holder = &lock.spec.holder;
    let allocation = caches
        .allocations
        .store()
        .get(&ObjectRef::new(&lock.spec.allocation).within(&holder.namespace));
    // A lock its holder's allocation released needs no pod to decide
    // (`lock_action` answers `Free` first): the pod is not read, which for
    // a pod the cache has not seen yet is a GET.
    let released = allocation
        .as_deref()
        .is_some_and(|a| !lock.held_among(std::slice::from_ref(a)));
    let pod = if released {
        None
    } else {
        caches
            .pod(&holder.namespace, &holder.name, &holder.uid)
            .await?
    };
    match lock_action(&lock, pod.as_ref(), allocation.as_deref(), Timestamp::now()) {
        LockAction::Free(reason) => {
            tracing::debug!(node = %lock.name_any(), holder = %holder.name, %reason, "NodeLock free");
            Ok(Action::await_change())
        }
        LockAction::Release(reason) => {
            let locks: Api<NodeLock> = Api::all(caches.client.clone());
            // Exactly the version judged: a Bind may have taken it since.
            let only_this = DeleteParams::default().preconditions(Preconditions {
                uid: lock.metadata.uid.clone(),
                resource_version: lock.metadata.resource_version.clone(),
            });
            match locks.delete(&lock.name_any(), &only_this).await {
                Ok(_) => {
                    tracing::info!(node = %lock.name_any(), holder = %holder.name, %reason, "released NodeLock")
                }
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => return Err(Error::kube("releasing the NodeLock")(e)),
            }
            caches.released_locks.add(version);
            Ok(Action::await_change())
        }
        LockAction::KeepUntil(expiry) => {
            let wait = expiry.duration_since(Timestamp::now()).unsigned_abs();
            Ok(Action::requeue(wait + Duration::from_millis(100)))
        }
    }
}
