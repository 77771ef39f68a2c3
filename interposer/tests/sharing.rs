//! Containers sharing one GPU: each container's compute limit is its own
//! processes' share of the device, however much the others queue, measured
//! with the fake NVML's per-process utilisation (`own_<i>` of the probe's
//! `launch` windows).

#[allow(dead_code)] // the sharing tests use only part of the test support
mod support;

use support::launch::{Run, TOLERANCE, assert_near, one_at_a_time};
use support::{Loader, World};

/// Asserts each window after the first of a probe's own utilisation is
/// within the tolerance of `target`.
fn assert_own_near(own: &[u64], target: u64, what: &str, stdout: &str) {
    eprintln!("{what}: own target {target} %, windows {own:?}");
    assert!(own.len() >= 3, "{what}: {stdout}");
    for (i, &w) in own.iter().enumerate().skip(1) {
        assert!(
            (w as i64 - target as i64).abs() <= TOLERANCE,
            "{what}: own window {i} at {w} %, target {target} %:\n{stdout}"
        );
    }
}

#[test]
fn contending_containers_each_get_their_own_limit() {
    let _turn = one_at_a_time();
    // Two containers at 30 % on one GPU: each gets 30 % of the device's time
    // for its own work, though its launches queue behind the other's.
    let a = World::new("8g").env("CUDA_DEVICE_SM_LIMIT", "30");
    let b = a.neighbour().env("CUDA_DEVICE_SM_LIMIT", "30");
    // Two more at 45 % on another GPU: together 90 %, so the device is
    // nearly saturated and queueing is at its worst.
    let c = World::new("8g").env("CUDA_DEVICE_SM_LIMIT", "45");
    let d = c.neighbour().env("CUDA_DEVICE_SM_LIMIT", "45");
    let runs: Vec<(Run, u64)> = [(&a, 30), (&b, 30), (&c, 45), (&d, 45)]
        .into_iter()
        .zip([
            Loader::Linked,
            Loader::Dlsym,
            Loader::ProcAddr,
            Loader::Linked,
        ])
        .map(|((world, target), loader)| (Run::start(world, loader, true, "kernel", "4.2"), target))
        .collect();
    for (run, target) in runs {
        let (device, output) = run.windows();
        assert_own_near(&output.own, target, &output.what, &output.stdout);
        // The device carries both containers: each within the tolerance
        // (their windows are not aligned, so the sum may be off by two).
        eprintln!("{}: device windows {device:?}", output.what);
        for &w in &device[1..] {
            assert!(
                (w as i64 - 2 * target as i64).abs() <= 2 * TOLERANCE,
                "{}: the device at {w} %:\n{}",
                output.what,
                output.stdout
            );
        }
    }
}

#[test]
fn without_per_process_utilisation_launches_are_charged_their_measured_time() {
    let _turn = one_at_a_time();
    // An NVML without per-process utilisation (as some GPUs and vGPU
    // profiles): the limiter charges launches their measured time, queueing
    // included, as it did before.
    let alone = World::new("8g")
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .env("FAKE_NVML_NO_PROCESS_UTILIZATION", "1");
    let c = World::new("8g")
        .env("CUDA_DEVICE_SM_LIMIT", "45")
        .env("FAKE_NVML_NO_PROCESS_UTILIZATION", "1");
    let d = c.neighbour().env("CUDA_DEVICE_SM_LIMIT", "45");
    let alone_run = Run::start(&alone, Loader::Linked, true, "kernel", "3.2");
    let contending: Vec<Run> = [&c, &d]
        .into_iter()
        .map(|w| Run::start(w, Loader::Linked, true, "kernel", "4.2"))
        .collect();
    let (windows, output) = alone_run.windows();
    assert!(output.own.is_empty(), "{}", output.stdout);
    assert_near(&windows, 30, &output);
    for run in contending {
        // Each container is charged its queueing too: together they stay
        // under their 90 %, never over.
        let (device, output) = run.windows();
        eprintln!("{}: fallback, device windows {device:?}", output.what);
        for &w in &device[1..] {
            assert!(w <= 90 + TOLERANCE as u64, "{}: {w} %", output.stdout);
        }
    }
}
