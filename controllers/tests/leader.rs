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

/// A TCP proxy to `upstream` that stops forwarding (holding every
/// connection open) while `frozen` is true: requests through it hang.
async fn freezable_proxy(
    upstream: std::net::SocketAddr,
    frozen: tokio::sync::watch::Receiver<bool>,
) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let Ok(n) = from.read(&mut buffer).await else {
                return;
            };
            if n == 0 || frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            if to.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await else {
                continue;
            };
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            tokio::spawn(pipe(in_read, out_write, frozen.clone()));
            tokio::spawn(pipe(out_read, in_write, frozen.clone()));
        }
    });
    port
}

#[tokio::test]
async fn a_leader_whose_renewals_hang_stops_before_a_standby_takes_over() {
    let plane = ControlPlane::start().await.unwrap();
    // replica-a reaches the API server through a proxy that can freeze.
    let mut config = plane.client_config().await.unwrap();
    let host = config.cluster_url.host().unwrap().to_owned();
    let upstream: std::net::SocketAddr =
        format!("{host}:{}", config.cluster_url.port_u16().unwrap())
            .parse()
            .unwrap();
    let (freeze, frozen) = tokio::sync::watch::channel(false);
    let port = freezable_proxy(upstream, frozen).await;
    config.cluster_url = format!("https://{host}:{port}").parse().unwrap();
    let through_proxy = kube::Client::try_from(config).unwrap();
    let direct = plane.client().await.unwrap();

    // What each replica's work did, in the order it happened.
    let events = Arc::new(std::sync::Mutex::new(Vec::<&'static str>::new()));
    let run = |client: kube::Client, identity: &'static str| {
        let events = events.clone();
        let election = Election {
            namespace: "default".into(),
            name: "tessera-hang".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(3),
        };
        tokio::spawn(async move {
            election
                .run(client, move || {
                    let events = events.clone();
                    async move {
                        struct Stop(Arc<std::sync::Mutex<Vec<&'static str>>>, &'static str);
                        impl Drop for Stop {
                            fn drop(&mut self) {
                                self.0.lock().unwrap().push(self.1);
                            }
                        }
                        let (start, stop) = match identity {
                            "replica-a" => ("a started", "a stopped"),
                            _ => ("b started", "b stopped"),
                        };
                        events.lock().unwrap().push(start);
                        let _stop = Stop(events, stop);
                        std::future::pending::<()>().await;
                    }
                })
                .await;
        })
    };
    let seen = |what: &'static str| {
        let events = events.clone();
        async move {
            tessera_testkit::eventually(what, Duration::from_secs(20), async || {
                events.lock().unwrap().contains(&what)
            })
            .await;
        }
    };
    let a = run(through_proxy, "replica-a");
    seen("a started").await;
    let b = run(direct, "replica-b");
    // The leader's renewals hang from now on: requests in flight and new ones.
    freeze.send(true).unwrap();
    seen("b started").await;
    let order = events.lock().unwrap().clone();
    let stopped = order.iter().position(|e| *e == "a stopped");
    let started = order.iter().position(|e| *e == "b started");
    assert!(
        stopped.is_some() && stopped < started,
        "the hung leader must stop before the standby starts: {order:?}"
    );
    a.abort();
    b.abort();
}
