//! Kueue (sigs.k8s.io/kueue, built with its CRDs by `hack/tools.sh` into
//! `<bin>/kueue`) on a [`ControlPlane`]: the controller manager as its
//! release runs it, with its own certificate management, configured for
//! `batch/v1` Jobs and the caller's resource transformations.
//!
//! Kueue's webhooks are not registered with the API server: they would be
//! called by its Service name, which a local control plane cannot resolve,
//! so Jobs are created suspended and with their queue label, as Kueue's
//! webhook would leave them. Its conversion webhook is registered (Kueue's
//! certificate management waits until it has put its CA into the CRDs) but
//! never called: every client here, Kueue included, speaks `v1beta2`, the
//! stored version. What a Deployment of Kueue gets from its manifests and
//! the kubelet, the harness does: the empty certificate Secret the
//! certificate rotator fills, and the files the kubelet would mount from it.

use std::path::PathBuf;

use k8s_openapi::{
    api::core::v1::{Namespace, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::wait::{await_condition, conditions},
};
use serde_json::{Value, json};

use crate::{control_plane::ControlPlane, error::Error, net::free_port, tools};

/// The namespace Kueue keeps its certificate Secret in.
pub const NAMESPACE: &str = "kueue-system";

/// The CRDs Kueue's certificate management puts its CA into.
const CONVERTED: [&str; 5] = [
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
];

/// The Secret Kueue's certificate rotator writes its webhook certificate to.
const SECRET: &str = "kueue-webhook-server-cert";

/// Waits until Kueue's certificate rotator has filled [`SECRET`], then
/// writes its certificate and key into `dir`, as the kubelet mounts them
/// into Kueue's pod (the rotator waits for the files).
async fn mount_certificate(secrets: &Api<Secret>, dir: &std::path::Path) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let data = secrets.get(SECRET).await?.data.unwrap_or_default();
        if let (Some(cert), Some(key)) = (data.get("tls.crt"), data.get("tls.key")) {
            for (name, bytes) in [("tls.crt", cert), ("tls.key", key)] {
                let path = dir.join(name);
                std::fs::write(&path, &bytes.0).map_err(Error::io("write", &path))?;
            }
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("Kueue to write its certificate into Secret {NAMESPACE}/{SECRET}"),
                seconds: 60,
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Where `hack/tools.sh` put Kueue: `<bin>/kueue`, holding `kueue` and `crds/`.
pub fn dir() -> Result<PathBuf, Error> {
    let dir = tools::bin_dir()?.join("kueue");
    if !dir.join(".complete").is_file() || !dir.join("kueue").is_file() {
        return Err(Error::Tools(format!(
            "{} holds no finished Kueue build; run hack/tools.sh",
            dir.display()
        )));
    }
    Ok(dir)
}

impl ControlPlane {
    /// Installs Kueue's CRDs, starts its controller manager with
    /// `resources` as its configuration's `resources` section (e.g. the
    /// transformations of Kueue's HAMi guide), and waits until it is ready.
    pub async fn start_kueue(&self, resources: Value) -> Result<(), Error> {
        let kueue = dir()?;
        self.install_kueue_crds(&kueue.join("crds")).await?;
        let client = self.client().await?;
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))
            .map_err(|e| Error::Config(e.to_string()))?;
        match Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": SECRET}}))
            .map_err(|e| Error::Config(e.to_string()))?;
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
        let certs = self.dir.join("kueue-certs");
        std::fs::create_dir_all(&certs).map_err(Error::io("create", &certs))?;
        let (health, webhook, visibility) = (free_port()?, free_port()?, free_port()?);
        let config = json!({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": format!("127.0.0.1:{health}")},
            "metrics": {"bindAddress": "0"},
            "webhook": {
                "port": webhook,
                "host": "127.0.0.1",
                "certDir": certs,
            },
            "leaderElection": {"leaderElect": false},
            "internalCertManagement": {
                "enable": true,
                "webhookServiceName": "kueue-webhook-service",
                "webhookSecretName": SECRET,
            },
            "clientConnection": {"qps": 100, "burst": 200},
            "integrations": {"frameworks": ["batch/job"]},
            "resources": resources,
        });
        let path = self.dir.join("kueue.yaml");
        let yaml = serde_yaml_ng::to_string(&config).map_err(|e| Error::Config(e.to_string()))?;
        std::fs::write(&path, yaml).map_err(Error::io("write", &path))?;
        let args = vec![
            format!("--config={}", path.display()),
            format!("--kubeconfig={}", self.kubeconfig().display()),
            format!("--visibility-server-port={visibility}"),
            "--zap-log-level=info".to_owned(),
        ];
        self.spawn("kueue", &kueue.join("kueue"), &args)?;
        mount_certificate(&secrets, &certs).await?;
        self.wait_ready(
            "Kueue /readyz",
            Some((&format!("http://127.0.0.1:{health}"), "/readyz")),
        )
        .await
    }

    /// Applies Kueue's CRDs, the converted ones with a conversion webhook
    /// (by URL, never called: see the module docs), and waits until every
    /// one is Established.
    async fn install_kueue_crds(&self, dir: &std::path::Path) -> Result<(), Error> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await?);
        let params = PatchParams::apply("tessera-e2e").force();
        let mut names = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(Error::io("read", dir))?;
        for entry in entries {
            let path = entry.map_err(Error::io("read", dir))?.path();
            let text = std::fs::read_to_string(&path).map_err(Error::io("read", &path))?;
            let mut crd: Value = serde_yaml_ng::from_str(&text)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            let name = crd["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            crd["apiVersion"] = json!("apiextensions.k8s.io/v1");
            crd["kind"] = json!("CustomResourceDefinition");
            if CONVERTED.contains(&name.as_str()) {
                crd["spec"]["conversion"] = json!({
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {"url": "https://127.0.0.1:1/convert"},
                    },
                });
            }
            api.patch(&name, &params, &Patch::Apply(&crd)).await?;
            names.push(name);
        }
        for name in &names {
            let established = await_condition(api.clone(), name, conditions::is_crd_established());
            tokio::time::timeout(std::time::Duration::from_secs(60), established)
                .await
                .map_err(|_| Error::Timeout {
                    what: format!("CRD {name} to become Established"),
                    seconds: 60,
                })?
                .map_err(|e| Error::Config(format!("watching CRD {name}: {e}")))?;
        }
        Ok(())
    }
}
