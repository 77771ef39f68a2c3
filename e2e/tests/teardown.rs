//! A control plane leaves nothing behind: not when the test panics, and not
//! when the test process is killed outright.
//!
//! Each case runs `teardown_child` in a child test process that starts a
//! control plane, reports its pids, port and directory, then panics or waits
//! to be killed.

use std::{
    fs,
    net::TcpListener,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tessera_e2e::{ControlPlane, process::is_alive};

const MODE: &str = "TESSERA_TEARDOWN_MODE";
const REPORT: &str = "TESSERA_TEARDOWN_REPORT";

#[test]
#[ignore = "run in a child process by the teardown tests"]
fn teardown_child() {
    let (Ok(mode), Ok(report)) = (std::env::var(MODE), std::env::var(REPORT)) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cluster = runtime.block_on(ControlPlane::start()).unwrap();
    let port: u16 = cluster
        .server()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let pids: Vec<u32> = cluster.pids().into_iter().map(|(_, pid)| pid).collect();
    let state = json!({"pids": pids, "port": port, "dir": cluster.dir()});
    fs::write(format!("{report}.tmp"), state.to_string()).unwrap();
    fs::rename(format!("{report}.tmp"), &report).unwrap();
    match mode.as_str() {
        "panic" => panic!("the test fails while its control plane runs"),
        _ => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
    }
}

/// Runs the child in `mode`; returns its report once written, and the child.
fn run_child(mode: &str, report: &Path) -> (Value, std::process::Child) {
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "teardown_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(MODE, mode)
        .env(REPORT, report)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !report.exists() {
        assert!(
            Instant::now() < deadline,
            "the child never started its control plane"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let state = serde_json::from_str(&fs::read_to_string(report).unwrap()).unwrap();
    (state, child)
}

fn assert_nothing_runs(state: &Value) {
    let pids: Vec<u32> = serde_json::from_value(state["pids"].clone()).unwrap();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver: {state}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while pids.iter().any(|p| is_alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let alive: Vec<_> = pids.iter().filter(|p| is_alive(**p)).collect();
    assert!(alive.is_empty(), "processes outlived the test: {alive:?}");
    let port = u16::try_from(state["port"].as_u64().unwrap()).unwrap();
    while TcpListener::bind(("127.0.0.1", port)).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| {
        let sockets = Command::new("ss")
            .args(["-tanp"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let held: Vec<String> = sockets
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!(":{port}")))
            .map(str::to_owned)
            .collect();
        panic!("API server port {port} still taken: {e}; sockets: {held:#?}")
    });
}

#[test]
fn a_panicking_test_stops_its_control_plane_and_removes_its_directory() {
    let scratch = tempdir();
    let (state, mut child) = run_child("panic", &scratch.join("report.json"));
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child test panics");
    assert_nothing_runs(&state);
    let dir = state["dir"].as_str().unwrap();
    assert!(!Path::new(dir).exists(), "{dir} was left behind");
}

#[test]
fn a_killed_test_process_takes_its_control_plane_with_it() {
    let scratch = tempdir();
    let (state, mut child) = run_child("hang", &scratch.join("report.json"));
    child.kill().unwrap(); // SIGKILL: no unwinding, no destructors.
    child.wait().unwrap();
    assert_nothing_runs(&state);
    // The next harness run sweeps the directory the killed process left.
    let dir = state["dir"].as_str().unwrap();
    tessera_e2e::remove_stale_dirs();
    assert!(!Path::new(dir).exists(), "{dir} was not swept");
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tessera-teardown-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Chaos tests kill etcd and kube-apiserver and start them again: what was
/// stored survives, and the API server serves again.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_and_the_api_server_restart_after_sigkill_and_keep_what_was_stored() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;

    let plane = ControlPlane::start().await.unwrap();
    let client = plane.client().await.unwrap();
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "default");
    let map: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kept"}, "data": {"k": "v"},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &map).await.unwrap();
    let pids = plane.pids();
    for name in ["etcd", "kube-apiserver"] {
        plane.kill_and_restart(name).await.unwrap();
    }
    let restarted = plane.pids();
    for name in ["etcd", "kube-apiserver"] {
        let pid = |all: &[(String, u32)]| all.iter().find(|(n, _)| n == name).map(|p| p.1);
        assert_ne!(pid(&pids), pid(&restarted), "{name} is a new process");
    }
    // The API server may answer before it has reconnected to etcd.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let kept = loop {
        match maps.get("kept").await {
            Ok(map) => break map,
            Err(error) => {
                assert!(std::time::Instant::now() < deadline, "{error}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(kept.data.unwrap()["k"], "v");
    assert!(plane.kill_and_restart("kube-nothing").await.is_err());
}
