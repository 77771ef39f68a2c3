//! Taking and releasing a node's NodeLock.
//!
//! A lock is taken by creating the NodeLock named after the node. When
//! another pod holds it, Bind waits (bounded) and takes it over as soon as
//! the lock has expired or its holder is gone, finished, or bound elsewhere;
//! a takeover replaces the object with its resourceVersion, so two waiters
//! can never both win.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams, Preconditions},
};
use tessera_api::v1alpha1::{NodeLock, NodeLockSpec, PodReference};

use crate::Error;

/// How often a waiting Bind looks at the lock again.
const POLL: Duration = Duration::from_millis(25);
/// How often a waiting Bind checks whether the holder pod still needs the lock.
const HOLDER_CHECK: Duration = Duration::from_millis(500);

/// A lock this Bind holds.
#[derive(Debug)]
pub struct HeldLock {
    node: String,
    uid: String,
    /// How long taking the lock took.
    pub waited: Duration,
}

/// A NodeLock naming `holder`, valid for `ttl_seconds` from now.
pub fn lock_object(
    node: &str,
    holder: &PodReference,
    allocation: &str,
    ttl_seconds: u32,
) -> NodeLock {
    let now =
        Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now());
    let expires = now
        .checked_add(SignedDuration::from_secs(i64::from(ttl_seconds)))
        .unwrap_or(now);
    NodeLock {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            ..Default::default()
        },
        spec: NodeLockSpec {
            holder: holder.clone(),
            allocation: allocation.to_owned(),
            acquired_at: Time(now),
            ttl_seconds,
            expires_at: Time(expires),
        },
    }
}

/// Takes the node's lock for `holder`, waiting up to `wait` for another holder.
pub async fn acquire(
    client: &Client,
    node: &str,
    holder: &PodReference,
    allocation: &str,
    ttl_seconds: u32,
    wait: Duration,
) -> Result<HeldLock, Error> {
    let locks: Api<NodeLock> = Api::all(client.clone());
    let started = Instant::now();
    let mut last_holder_check: Option<Instant> = None;
    loop {
        let wanted = lock_object(node, holder, allocation, ttl_seconds);
        match locks.create(&PostParams::default(), &wanted).await {
            Ok(created) => return Ok(held(node, &created, started)),
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(e) => return Err(Error::kube(format!("creating NodeLock {node}"))(e)),
        }
        // Someone holds it: wait with reads only, and write again only when
        // it is gone (create) or ours to take over (replace).
        loop {
            let read = locks
                .get_opt(node)
                .await
                .map_err(Error::kube(format!("reading NodeLock {node}")))?;
            let Some(current) = read else { break };
            // A retry of this very pod, or a lock that has lapsed, is ours to take.
            let ours_or_lapsed = current.spec.holder.uid == holder.uid
                || current.spec.expires_at.0 <= Timestamp::now();
            let takeover = if ours_or_lapsed {
                true
            } else if last_holder_check.is_none_or(|t| t.elapsed() >= HOLDER_CHECK) {
                last_holder_check = Some(Instant::now());
                !holder_needs_lock(client, &current).await?
            } else {
                false
            };
            if takeover {
                let mut replacement = lock_object(node, holder, allocation, ttl_seconds);
                replacement.metadata.resource_version = current.metadata.resource_version.clone();
                match locks
                    .replace(node, &PostParams::default(), &replacement)
                    .await
                {
                    Ok(replaced) => {
                        tracing::info!(node, previous = %current.spec.holder.name, "took over NodeLock");
                        return Ok(held(node, &replaced, started));
                    }
                    Err(kube::Error::Api(status))
                        if status.is_conflict() || status.is_not_found() =>
                    {
                        break;
                    }
                    Err(e) => return Err(Error::kube(format!("taking over NodeLock {node}"))(e)),
                }
            }
            if started.elapsed() >= wait {
                return Err(Error::LockBusy {
                    node: node.to_owned(),
                    holder: format!(
                        "{}/{}",
                        current.spec.holder.namespace, current.spec.holder.name
                    ),
                    waited_ms: started.elapsed().as_millis(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Releases a lock this Bind took (only that incarnation of it).
pub async fn release(client: &Client, lock: &HeldLock) {
    let locks: Api<NodeLock> = Api::all(client.clone());
    let params = DeleteParams::default().preconditions(Preconditions {
        uid: Some(lock.uid.clone()),
        resource_version: None,
    });
    if let Err(error) = locks.delete(&lock.node, &params).await {
        tracing::debug!(%error, node = %lock.node, "NodeLock already gone");
    }
}

/// Whether the lock's holder still waits for its devices on the lock's node,
/// decided exactly as the lifecycle controller decides it
/// ([`crate::lifecycle::lock_action`]): the holder exists with the same UID,
/// is not finishing, and is not bound to another node.
pub async fn holder_needs_lock(client: &Client, lock: &NodeLock) -> Result<bool, Error> {
    let holder = &lock.spec.holder;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &holder.namespace);
    let pod = pods
        .get_opt(&holder.name)
        .await
        .map_err(Error::kube("reading the NodeLock holder"))?;
    let action = crate::lifecycle::lock_action(lock, pod.as_ref(), None, Timestamp::now());
    Ok(matches!(action, crate::lifecycle::LockAction::KeepUntil(_)))
}

fn held(node: &str, lock: &NodeLock, started: Instant) -> HeldLock {
    HeldLock {
        node: node.to_owned(),
        uid: lock.metadata.uid.clone().unwrap_or_default(),
        waited: started.elapsed(),
    }
}
