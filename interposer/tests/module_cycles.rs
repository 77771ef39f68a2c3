//! No import circle: `hack/module-cycles.py` lists the module dependency
//! edges of the interposer and of the fakes and fails on a cycle
//! between files or top-level modules (and, for the interposer, on an edge
//! from a layer to one above it). Skipped, saying so, without `python3`.

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
        Err(e) => {
            eprintln!("SKIPPED: cannot run python3 ({e}); module cycles of {src} not checked");
            return;
        }
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
