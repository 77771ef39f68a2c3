//! Leader election against a real API server: one leader at a time, a
//! standby takes over after the leader stops renewing, and a leader whose
//! renewals hang stops first. The tests follow what the candidates' work
//! did, in order, never a wall-clock window.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tessera_controllers::leader::Election;
use tessera_e2e::ControlPlane;

/// What the candidates' work did, in the order it happened.
type Events = Arc<Mutex<Vec<String>>>;

/// Starts candidate `identity` for Lease `lease` (3 s); its work records
/// `<identity> started` when it starts and `<identity> stopped` when it is
/// cancelled.
fn candidate(
    client: Client,
    identity: &'static str,
    lease: &'static str,
    events: &Events,
) -> tokio::task::JoinHandle<()> {
    let events = events.clone();
    let election = Election {
        namespace: "default".into(),
        name: lease.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
    };
    tokio::spawn(async move {
        election
            .run(client, move || {
                let events = events.clone();
                async move {
                    struct Stop(Events, &'static str);
                    impl Drop for Stop {
                        fn drop(&mut self) {
                            self.0.lock().unwrap().push(format!("{} stopped", self.1));
                        }
                    }
                    events.lock().unwrap().push(format!("{identity} started"));
                    let _stop = Stop(events, identity);
                    std::future::pending::<()>().await;
                }
            })
            .await;
    })
}

/// Waits until `event` has happened.
async fn seen(events: &Events, event: &str) {
    tessera_testkit::eventually(event, Duration::from_secs(20), async || {
        events.lock().unwrap().iter().any(|e| e == event)
    })
    .await;
}

/// Where `event` is in the order, if it happened.
fn position(events: &Events, event: &str) -> Option<usize> {
    events.lock().unwrap().iter().position(|e| e == event)
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_standby_takes_over() {
    let plane = ControlPlane::start().await.unwrap();
    let client = plane.client().await.unwrap();
    let events = Events::default();
    let a = candidate(client.clone(), "a", "tessera-test", &events);
    seen(&events, "a started").await;
    let b = candidate(client.clone(), "b", "tessera-test", &events);
    // The leader renews several times while the standby competes.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let versions = Mutex::new(std::collections::BTreeSet::new());
    tessera_testkit::eventually("three renewals", Duration::from_secs(20), async || {
        if let Ok(lease) = leases.get("tessera-test").await {
            let version = lease.metadata.resource_version.unwrap_or_default();
            versions.lock().unwrap().insert(version);
        }
        versions.lock().unwrap().len() >= 4
    })
    .await;
    assert_eq!(position(&events, "b started"), None, "two leaders at once");

    a.abort(); // the leader dies without releasing the Lease
    seen(&events, "b started").await;
    assert!(
        position(&events, "a stopped") < position(&events, "b started"),
        "the old leader's work stopped before the standby's started: {:?}",
        events.lock().unwrap()
    );
    b.abort();
}

#[tokio::test]
async fn a_leader_whose_renewals_hang_stops_before_a_standby_takes_over() {
    let plane = ControlPlane::start().await.unwrap();
    // replica-a reaches the API server through a proxy that can freeze.
    let (through_proxy, freeze) = plane.freezable_client().await.unwrap();
    let direct = plane.client().await.unwrap();

    let events = Events::default();
    let a = candidate(through_proxy, "a", "tessera-hang", &events);
    seen(&events, "a started").await;
    let b = candidate(direct, "b", "tessera-hang", &events);
    // The leader's renewals hang from now on: requests in flight and new ones.
    freeze.send(true).unwrap();
    seen(&events, "b started").await;
    let (stopped, started) = (
        position(&events, "a stopped"),
        position(&events, "b started"),
    );
    assert!(
        stopped.is_some() && stopped < started,
        "the hung leader must stop before the standby starts: {:?}",
        events.lock().unwrap()
    );
    a.abort();
    b.abort();
}
