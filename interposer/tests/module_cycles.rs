//! No import circle: `hack/module-cycles.py` lists the module dependency
//! edges of every crate of the workspace (the members of the root
//! `Cargo.toml`, so a new crate is checked without being listed here) and
//! fails on a cycle between files or top-level modules (and, for the
//! interposer, on an edge from a layer to one above it). A script that
//! cannot run fails the test: a check that passes without running proves
//! nothing.

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

/// The workspace's members, from the root `Cargo.toml`'s `members = [...]`.
fn workspace_members() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let text = std::fs::read_to_string(&root).expect("the workspace Cargo.toml");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members line in the workspace Cargo.toml");
    let list = line
        .split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'));
    let (list, _) = list.expect("members = [...] on one line");
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

#[test]
fn every_other_workspace_crate_has_no_import_circle() {
    let members = workspace_members();
    assert!(members.len() > 10, "members read: {members:?}");
    // The interposer itself is checked above, with its layers.
    for member in members.iter().filter(|m| m.as_str() != "interposer") {
        check(&format!("../{member}/src"), &[]);
    }
}
