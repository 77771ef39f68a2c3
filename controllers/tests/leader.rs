//! Leader election against a real API server: one leader at a time, and a
//! standby takes over after the leader stops renewing.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tessera_controllers::leader::Election;
use tessera_e2e::ControlPlane;

fn election(identity: &str) -> Election {
    Election {
        namespace: "default".into(),
        name: "tessera-test".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
    }
}

/// Starts a candidate whose work counts itself in `leaders` while it runs.
fn candidate(
    client: kube::Client,
    identity: &str,
    leaders: Arc<AtomicUsize>,
    led: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let election = election(identity);
    tokio::spawn(async move {
        election
            .run(client, move || {
                let (leaders, led) = (leaders.clone(), led.clone());
                async move {
                    leaders.fetch_add(1, Ordering::SeqCst);
                    led.fetch_add(1, Ordering::SeqCst);
                    struct Leave(Arc<AtomicUsize>);
                    impl Drop for Leave {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    let _leave = Leave(leaders);
                    std::future::pending::<()>().await;
                }
            })
            .await;
    })
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_standby_takes_over() {
    let plane = ControlPlane::start().await.unwrap();
    let client = plane.client().await.unwrap();
    let leaders = Arc::new(AtomicUsize::new(0));
    let (a_led, b_led) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = candidate(client.clone(), "replica-a", leaders.clone(), a_led.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = candidate(client.clone(), "replica-b", leaders.clone(), b_led.clone());

    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(leaders.load(Ordering::SeqCst) <= 1, "two leaders at once");
    }
    assert_eq!(
        (a_led.load(Ordering::SeqCst), b_led.load(Ordering::SeqCst)),
        (1, 0),
        "replica-a leads, replica-b waits"
    );

    a.abort(); // the leader dies without releasing the Lease
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while b_led.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        leaders.load(Ordering::SeqCst),
        1,
        "the old leader's work stopped with it"
    );
    b.abort();
}
