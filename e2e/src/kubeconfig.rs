//! The admin kubeconfig of a local control plane.

use std::{fs, path::Path};

use base64::{Engine, engine::general_purpose::STANDARD};
use serde_json::json;

use crate::{error::Error, pki::Pki};

/// Writes a kubeconfig with the CA embedded and the admin token, so the file
/// works wherever it is copied.
pub(crate) fn write(path: &Path, server: &str, pki: &Pki) -> Result<(), Error> {
    let ca = fs::read(&pki.ca_cert).map_err(Error::io("read", &pki.ca_cert))?;
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tessera", "cluster": {"server": server, "certificate-authority-data": STANDARD.encode(ca)}}],
        "users": [{"name": "tessera-admin", "user": {"token": pki.admin_token}}],
        "contexts": [{"name": "tessera", "context": {"cluster": "tessera", "user": "tessera-admin"}}],
        "current-context": "tessera",
    });
    let yaml = serde_yaml_ng::to_string(&config).map_err(|e| Error::Config(e.to_string()))?;
    fs::write(path, yaml).map_err(Error::io("write", path))
}
