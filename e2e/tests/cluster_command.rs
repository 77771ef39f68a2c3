//! `tessera-cluster up/down` (behind `make cluster` and `make cluster-down`):
//! a detached control plane that kubectl can use, and that `down` removes.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use tessera_e2e::process::is_alive;

const BIN: &str = env!("CARGO_BIN_EXE_tessera-cluster");

fn run(args: &[&str], dir: &Path) -> Output {
    let output = Command::new(BIN)
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tessera-cluster {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `down` even when an assertion fails, so no detached process survives the test.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .arg("down")
            .arg("--dir")
            .arg(&self.0)
            .output();
    }
}

#[test]
fn up_serves_kubectl_and_down_removes_everything() {
    let dir = std::env::temp_dir().join(format!("tessera-cluster-cmd-{}", std::process::id()));
    let _down = Down(dir.clone());

    let up = run(&["up"], &dir);
    let told = String::from_utf8_lossy(&up.stderr);
    assert!(
        told.contains("export KUBECONFIG=") && told.contains("kubeconfig"),
        "{told}"
    );
    let state: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let pids: Vec<u32> = state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(pids.len(), 2, "{state}");

    let kubectl = dir.join("bin/kubectl");
    let crds = Command::new(&kubectl)
        .args(["get", "crd", "-o", "name"])
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .output()
        .unwrap();
    let crds = String::from_utf8_lossy(&crds.stdout);
    for name in ["gpunodes", "vgpuallocations", "nodelocks", "gpunodeconfigs"] {
        assert!(crds.contains(&format!("{name}.tessera.dev")), "{crds}");
    }
    let list = Command::new(&kubectl)
        .args(["get", "vgpuallocations", "-A"])
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .output()
        .unwrap();
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );

    let again = run(&["up"], &dir);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));

    run(&["down"], &dir);
    assert!(!dir.exists(), "down leaves {} behind", dir.display());
    for pid in pids {
        assert!(!is_alive(pid), "pid {pid} survived down");
    }
}
