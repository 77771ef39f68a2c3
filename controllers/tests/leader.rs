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

/// `verb` requests on Leases the API server has answered so far (every
/// client, every code), from its `/metrics`.
async fn lease_requests(client: &Client, verb: &str) -> u64 {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap();
    let verb = format!("verb=\"{verb}\"");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"leases\"") && l.contains(&verb))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn a_leader_renews_with_one_write_and_no_read() {
    let plane = ControlPlane::start().await.unwrap();
    let client = plane.client().await.unwrap();
    let events = Events::default();
    let a = candidate(client.clone(), "a", "tessera-renew", &events);
    seen(&events, "a started").await;
    let (puts, gets) = (
        lease_requests(&client, "PUT").await,
        lease_requests(&client, "GET").await,
    );
    // Six renewals (a 3 s Lease renews every 0.5 s; the API server's own
    // identity Lease adds one write every 10 s at most).
    tessera_testkit::eventually("six renewals", Duration::from_secs(20), async || {
        lease_requests(&client, "PUT").await >= puts + 6
    })
    .await;
    let read = lease_requests(&client, "GET").await - gets;
    assert!(
        read <= 1,
        "the leader read its Lease {read} times in six renewals"
    );
    assert_eq!(position(&events, "a stopped"), None, "the leader stopped");
    a.abort();
}

#[tokio::test]
async fn a_leader_whose_lease_another_wrote_stops_and_takes_it_back_once_it_lapses() {
    let plane = ControlPlane::start().await.unwrap();
    let client = plane.client().await.unwrap();
    let events = Events::default();
    let a = candidate(client.clone(), "a", "tessera-taken", &events);
    seen(&events, "a started").await;
    // Someone else writes the Lease as its holder: the leader's next
    // renewal carries a stale resourceVersion and must not overwrite it.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let mut lease = leases.get("tessera-taken").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace("tessera-taken", &Default::default(), &lease)
        .await
        .unwrap();
    seen(&events, "a stopped").await;
    // The intruder never renews: after a whole duration `a` leads again.
    tessera_testkit::eventually("a leads again", Duration::from_secs(20), async || {
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| *e == "a started")
            .count()
            == 2
    })
    .await;
    let holder = leases.get("tessera-taken").await.unwrap().spec.unwrap();
    assert_eq!(holder.holder_identity.as_deref(), Some("a"));
    a.abort();
}
