//! Leader election through a coordination.k8s.io Lease, so that replicated
//! controllers run their lifecycle controllers in one replica at a time.
//!
//! As client-go's `leaderelection`:
//! - A candidate takes the Lease when it does not exist, when it holds it
//!   already, or when the record has not changed for the Lease's duration
//!   **as this candidate observed it, on its own monotonic clock**: the
//!   holder's `renewTime` is written for people, never compared with
//!   another replica's clock.
//! - Every write carries the resourceVersion it read (or, for the leader's
//!   renewal, the one its own last write returned), so two candidates can
//!   never both win, and a candidate can only take over a record it has seen.
//!   The leader renews with that one write and no read; a conflict sends it
//!   back to reading the Lease as a candidate would.
//! - The leader renews every [`Election::retry_period`] and stops its work
//!   when no renewal has succeeded for [`Election::renew_deadline`] (two
//!   thirds of the duration), even while a renewal hangs. A rival waits a
//!   whole duration after it first saw the last renewal, which happened after
//!   the leader sent it, so the leader has stopped before anyone else starts.

use std::{future::Future, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, ResourceExt, api::PostParams};
use tokio::time::Instant;

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
    /// How long a rival waits after it last saw the record change before
    /// it takes the Lease.
    pub lease_duration: Duration,
}

/// The Lease record as this candidate last saw it change, on its own clock.
#[derive(Debug, Default)]
struct Observed {
    /// The record's resourceVersion.
    version: String,
    /// When this candidate first read that version.
    at: Option<Instant>,
}

impl Observed {
    /// Notes a read of `version`; the time moves only when the record did.
    fn saw(&mut self, version: &str, now: Instant) {
        if self.at.is_none() || self.version != version {
            self.version = version.to_owned();
            self.at = Some(now);
        }
    }

    /// Whether the record has stood unchanged for `duration`.
    fn lapsed(&self, duration: Duration, now: Instant) -> bool {
        self.at
            .is_some_and(|at| now.saturating_duration_since(at) >= duration)
    }
}

impl Election {
    /// How long the leader keeps working without a successful renewal:
    /// two thirds of the Lease's duration (client-go's 10 s of 15 s).
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    /// How often the Lease is tried: a sixth of its duration.
    pub fn retry_period(&self) -> Duration {
        self.lease_duration / 6
    }

    /// Runs `work` whenever this candidate leads, forever: the work is
    /// dropped (cancelled) when leadership is lost or cannot be confirmed
    /// within the renew deadline, and started again when it is regained.
    pub async fn run<F, Fut>(&self, client: Client, mut work: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let leases: Api<Lease> = Api::namespaced(client, &self.namespace);
        let mut observed = Observed::default();
        loop {
            let attempt = tokio::time::timeout(
                self.renew_deadline(),
                self.try_acquire(&leases, &mut observed),
            );
            let started = Instant::now();
            match attempt.await {
                Ok(Ok(Some(held))) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    // Dropped (and so cancelled) on losing leadership, and also
                    // if this election itself is cancelled.
                    let task = AbortOnDrop(tokio::spawn(work()));
                    self.keep(&leases, &mut observed, started, held).await;
                    drop(task);
                    tracing::warn!(lease = %self.name, identity = %self.identity, "lost leadership; work stopped");
                }
                Ok(Ok(None)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, lease = %self.name, "leader election failed; retrying")
                }
                Err(_) => {
                    tracing::warn!(lease = %self.name, "leader election timed out; retrying")
                }
            }
            tokio::time::sleep(self.retry_period()).await;
        }
    }

    /// Renews while leading; returns when another holds the Lease or when
    /// no renewal has succeeded for the renew deadline (a renewal in
    /// flight then is abandoned). `renewed`: when the last successful
    /// write was sent; `held`: the Lease as that write left it.
    async fn keep(
        &self,
        leases: &Api<Lease>,
        observed: &mut Observed,
        mut renewed: Instant,
        mut held: Lease,
    ) {
        loop {
            let deadline = renewed + self.renew_deadline();
            tokio::time::sleep_until((Instant::now() + self.retry_period()).min(deadline)).await;
            if Instant::now() >= deadline {
                tracing::warn!(lease = %self.name, "no renewal within the renew deadline");
                return;
            }
            let sent = Instant::now();
            match tokio::time::timeout_at(deadline, self.renew(leases, observed, &held)).await {
                Ok(Ok(Some(written))) => (renewed, held) = (sent, written),
                Ok(Ok(None)) => return,
                Ok(Err(error)) => {
                    tracing::warn!(%error, lease = %self.name, "renewing the leader Lease failed; retrying until the renew deadline");
                }
                Err(_) => {
                    tracing::warn!(lease = %self.name, "renewing the leader Lease hung past the renew deadline");
                    return;
                }
            }
        }
    }

    /// Renews the Lease this leader last wrote, `held`, with one write and
    /// no read, as client-go's leader does: the write carries `held`'s
    /// resourceVersion, so it only succeeds if nobody wrote the Lease
    /// since. Anything else (a conflict, an error) falls back to reading
    /// the Lease and deciding as a candidate does.
    async fn renew(
        &self,
        leases: &Api<Lease>,
        observed: &mut Observed,
        held: &Lease,
    ) -> Result<Option<Lease>, Error> {
        match self.write(leases, observed, held, Timestamp::now()).await {
            Ok(written) => Ok(Some(written)),
            Err(error) => {
                tracing::debug!(%error, lease = %self.name, "renewing without a read failed; reading the Lease");
                self.try_acquire(leases, observed).await
            }
        }
    }

    /// The Lease's duration as written in it.
    fn seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// Takes or renews the Lease after reading it: the Lease as written
    /// when this candidate holds it, `None` while someone else does.
    async fn try_acquire(
        &self,
        leases: &Api<Lease>,
        observed: &mut Observed,
    ) -> Result<Option<Lease>, Error> {
        let seconds = self.seconds();
        let existing = leases
            .get_opt(&self.name)
            .await
            .map_err(Error::kube("reading the leader Lease"))?;
        let now = Timestamp::now();
        let Some(existing) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None, now, seconds)),
            };
            return match leases.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(Some(created)),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(None),
                Err(e) => Err(Error::kube("creating the leader Lease")(e)),
            };
        };
        observed.saw(
            existing.resource_version().as_deref().unwrap_or_default(),
            Instant::now(),
        );
        let spec = existing.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let free = spec.holder_identity.as_deref().is_none_or(str::is_empty);
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.lease_duration, Duration::from_secs);
        if !ours && !free && !observed.lapsed(duration, Instant::now()) {
            return Ok(None);
        }
        match self.write(leases, observed, &existing, now).await {
            Ok(written) => Ok(Some(written)),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(None),
            Err(e) => Err(Error::kube("renewing the leader Lease")(e)),
        }
    }

    /// Writes `read` back as held by this candidate and renewed at `now`,
    /// on condition of `read`'s resourceVersion; notes what was written.
    async fn write(
        &self,
        leases: &Api<Lease>,
        observed: &mut Observed,
        read: &Lease,
        now: Timestamp,
    ) -> Result<Lease, kube::Error> {
        let mut lease = read.clone();
        lease.spec = Some(self.spec(read.spec.as_ref(), now, self.seconds()));
        let written = leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        observed.saw(
            written.resource_version().as_deref().unwrap_or_default(),
            Instant::now(),
        );
        Ok(written)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_lapses_only_after_standing_unchanged_on_the_observers_clock() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut observed = Observed::default();
        assert!(!observed.lapsed(second, start), "never seen: not lapsed");
        observed.saw("10", start);
        assert!(!observed.lapsed(second, start + second / 2));
        // Seen again unchanged: the clock keeps running from the first read.
        observed.saw("10", start + second / 2);
        assert!(observed.lapsed(second, start + second));
        // A renewal (a new version) starts it over.
        observed.saw("11", start + second);
        assert!(!observed.lapsed(second, start + second + second / 2));
        assert!(observed.lapsed(second, start + 2 * second));
        let election = Election {
            namespace: "n".into(),
            name: "l".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(15),
        };
        assert_eq!(election.renew_deadline(), Duration::from_secs(10));
        assert!(election.retry_period() < election.renew_deadline());
    }
}
