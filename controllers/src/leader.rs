//! Leader election through a coordination.k8s.io Lease, so that replicated
//! controllers run their lifecycle controllers in one replica at a time.
//!
//! A candidate takes the Lease when it does not exist, when it holds it
//! already, or when the holder has not renewed it for `leaseDurationSeconds`.
//! Every write carries the resourceVersion it read, so two candidates can
//! never both win. The leader renews every third of the duration and stops
//! its work as soon as a renewal fails.

use std::{future::Future, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{Api, Client, api::PostParams};

use crate::Error;

/// A task that is cancelled when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Who competes for which Lease.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This candidate's identity (e.g. the pod name).
    pub identity: String,
    /// How long a holder stays leader without renewing.
    pub lease_duration: Duration,
}

impl Election {
    /// Runs `work` whenever this candidate leads, forever: the work is
    /// dropped (cancelled) when leadership is lost, and started again when
    /// it is regained.
    pub async fn run<F, Fut>(&self, client: Client, mut work: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let leases: Api<Lease> = Api::namespaced(client, &self.namespace);
        let retry = self.lease_duration / 3;
        loop {
            match self.try_acquire(&leases).await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    // Dropped (and so cancelled) on losing leadership, and also
                    // if this election itself is cancelled.
                    let task = AbortOnDrop(tokio::spawn(work()));
                    while matches!(self.try_acquire(&leases).await, Ok(true)) {
                        tokio::time::sleep(retry).await;
                    }
                    drop(task);
                    tracing::warn!(lease = %self.name, identity = %self.identity, "lost leadership");
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, lease = %self.name, "leader election failed; retrying")
                }
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Takes or renews the Lease; `Ok(false)` while someone else holds it.
    pub async fn try_acquire(&self, leases: &Api<Lease>) -> Result<bool, Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let existing = leases
            .get_opt(&self.name)
            .await
            .map_err(Error::kube("reading the leader Lease"))?;
        let Some(existing) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None, now, seconds)),
            };
            return match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(Error::kube("creating the leader Lease")(e)),
            };
        };
        let spec = existing.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let renewed = spec
            .renew_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let duration =
            SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(seconds)));
        let lapsed = renewed
            .checked_add(duration)
            .map(|until| until <= now)
            .unwrap_or(true);
        if !ours && !lapsed {
            return Ok(false);
        }
        let mut lease = existing.clone();
        lease.spec = Some(self.spec(Some(&spec), now, seconds));
        match leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(Error::kube("renewing the leader Lease")(e)),
        }
    }

    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp, seconds: i32) -> LeaseSpec {
        let ours =
            previous.is_some_and(|p| p.holder_identity.as_deref() == Some(self.identity.as_str()));
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }
}
