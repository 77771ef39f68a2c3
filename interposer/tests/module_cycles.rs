//! No import circle: `hack/module-cycles.py` lists the module dependency
//! edges of the interposer, of the fakes and of the workspace's other
//! crates that have none today, and fails on a cycle between files or
//! top-level modules (and, for the interposer, on an edge from a layer to
//! one above it). A script that cannot run fails the test: a check that
//! passes without running proves nothing. (controllers, node-agent and e2e
//! still have circles, through `mod.rs` files that
//! define items their children use and re-export the children's; they are
//! not listed until they have none.)

use std::path::Path;
use std::process::Command;

/// Runs the script over the crate sources under `src`, with `args`.
fn check(src: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("../hack/module-cycles.py");
    let output = match Command::new("python3")
        .arg(&script)
        .arg(root.join(src))
        .args(args)
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!("cannot run python3 ({e}): module cycles of {src} not checked"),
    };
    assert!(
        output.status.success(),
        "{} {src}: {}\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout),
    );
}

#[test]
fn the_interposer_s_layers_only_depend_downwards() {
    check(
        "src",
        &[
            "--layers",
            "sys,log,config,driver,accounting,policy,exports",
        ],
    );
}

#[test]
fn the_fake_driver_and_the_fake_gpu_crates_have_no_import_circle() {
    for src in ["fake-driver/src", "fake-gpu/src", "fake-nvml/src"] {
        check(src, &[]);
    }
}

#[test]
fn the_workspace_crates_without_circles_keep_none() {
    for src in [
        "../node-agent/deviceplugin/src",
        "../node-agent/draplugin/src",
        "../node-agent/nvml-mig/src",
        "../kubekit/src",
        "../telemetry/src",
        "../testkit/src",
        "../bench/src",
        "support/src",
        "region/src",
        "../api/src",
    ] {
        check(src, &[]);
    }
}
