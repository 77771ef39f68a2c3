//! Runs helm (v3, built by `hack/tools.sh`) on Tessera's chart.
//!
//! Every command gets private cache, config and data directories under the
//! system temp dir, so tests never read or write the user's helm settings.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::{error::Error, tools};

/// The chart in this repository.
pub fn chart_dir() -> PathBuf {
    tools::repo_root().join("charts/tessera")
}

/// The values file that turns every option on (`helm lint` and `helm
/// template` run with it beside the defaults).
pub fn all_on_values() -> PathBuf {
    chart_dir().join("ci/all-on-values.yaml")
}

/// A `helm` command; with `kubeconfig`, pointed at that cluster.
pub fn command(kubeconfig: Option<&Path>) -> Result<Command, Error> {
    let mut command = Command::new(tools::binary("helm")?);
    let home = std::env::temp_dir().join(format!("tessera-helm-{}", std::process::id()));
    for (variable, dir) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ] {
        command.env(variable, home.join(dir));
    }
    match kubeconfig {
        Some(path) => command.env("KUBECONFIG", path),
        None => command.env_remove("KUBECONFIG"),
    };
    Ok(command)
}

/// Runs `command`, returning stdout, or an error with the command and its stderr.
pub fn run(command: &mut Command) -> Result<String, Error> {
    let output = output(command)?;
    if !output.status.success() {
        return Err(Error::Config(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `command` and returns whatever it printed, whether it succeeded or not.
pub fn output(command: &mut Command) -> Result<Output, Error> {
    let program = PathBuf::from(command.get_program());
    command.output().map_err(Error::io("run", program))
}

/// Splits a multi-document YAML stream (`helm template`) into its objects,
/// skipping empty documents.
pub fn objects(stream: &str) -> Result<Vec<serde_json::Value>, Error> {
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(stream) {
        let value: serde_json::Value = serde::Deserialize::deserialize(document)
            .map_err(|e| Error::Config(format!("rendered YAML: {e}")))?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}
