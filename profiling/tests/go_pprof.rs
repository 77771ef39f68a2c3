//! `go tool pprof` (Go is installed where the suite runs) reads the CPU and
//! heap profiles this crate serves, fetched over HTTP exactly as an operator
//! fetches HAMi's, and finds in them the functions that burned the CPU and
//! hold the memory.

use std::{
    hint::black_box,
    net::SocketAddr,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[global_allocator]
static ALLOCATOR: tessera_profiling::Allocator = tessera_profiling::Allocator;

#[inline(never)]
fn burn_cpu_for_the_profile(stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

#[inline(never)]
fn hold_memory_for_the_heap_profile() -> Vec<Vec<u8>> {
    // 64 MiB in 1 MiB pieces, each certainly sampled (one sample per
    // ~512 KiB allocated).
    (0..64).map(|i| vec![i as u8; 1 << 20]).collect()
}

/// `go tool pprof -top -cum URL`, its profile saved under a scratch
/// directory; panics with pprof's output when it fails.
fn go_pprof_top(url: &str, scratch: &std::path::Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof", "-top", "-cum", url])
        .env("PPROF_TMPDIR", scratch)
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("run `go tool pprof` (Go must be installed)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "go tool pprof {url}:\n{text}");
    text
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_tool_pprof_reads_the_cpu_and_heap_profiles() {
    let server = tessera_profiling::Server::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run());
    let held = black_box(hold_memory_for_the_heap_profile());
    let scratch = tempfile::tempdir().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let burner = std::thread::spawn({
        let stop = stop.clone();
        move || burn_cpu_for_the_profile(&stop)
    });
    let cpu_url = format!("http://{addr}/debug/pprof/profile?seconds=2");
    let dir = scratch.path().to_owned();
    let cpu = tokio::task::spawn_blocking(move || go_pprof_top(&cpu_url, &dir))
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    burner.join().unwrap();
    assert!(
        cpu.contains("burn_cpu_for_the_profile"),
        "the CPU profile misses the function that burned the CPU:\n{cpu}"
    );

    let heap_url = format!("http://{addr}/debug/pprof/heap");
    let dir = scratch.path().to_owned();
    let heap = tokio::task::spawn_blocking(move || go_pprof_top(&heap_url, &dir))
        .await
        .unwrap();
    assert!(
        heap.contains("hold_memory_for_the_heap_profile"),
        "the heap profile misses the function that holds 64 MiB:\n{heap}"
    );
    assert!(heap.contains("inuse_space"), "{heap}");
    drop(held);

    // In the same test: the CPU profiler is one per process.
    bad_lengths_and_a_second_profile_are_refused_with_the_reason(addr).await;
}

async fn bad_lengths_and_a_second_profile_are_refused_with_the_reason(addr: SocketAddr) {
    for bad in ["0", "301", "-1", "ten", "1.5"] {
        let (status, body) = get(addr, &format!("/debug/pprof/profile?seconds={bad}")).await;
        assert_eq!(status, 400, "seconds={bad}: {body}");
        assert!(
            body.contains(&format!("seconds=\"{bad}\"")) && body.contains("from 1 to 300"),
            "seconds={bad}: {body}"
        );
    }

    let first = tokio::spawn(async move { get(addr, "/debug/pprof/profile?seconds=2").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = get(addr, "/debug/pprof/profile?seconds=1").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("already being taken"), "{body}");
    let (status, _) = first.await.unwrap();
    assert_eq!(status, 200);

    let (status, index) = get(addr, "/debug/pprof/").await;
    assert_eq!(status, 200);
    assert!(index.contains("/debug/pprof/heap"), "{index}");
}
