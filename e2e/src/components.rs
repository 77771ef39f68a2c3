//! kube-scheduler and kube-controller-manager on a [`ControlPlane`].

use std::{fs, path::Path};

use serde_json::{Value, json};

use crate::{control_plane::ControlPlane, error::Error, net::free_port, tools};

impl ControlPlane {
    /// Starts kube-scheduler with the caller's `KubeSchedulerConfiguration`
    /// (YAML), and waits until it is healthy.
    ///
    /// The harness fills `clientConnection.kubeconfig` with the admin
    /// kubeconfig and, unless the configuration says otherwise, turns leader
    /// election off. Everything else (profiles, extenders) is the caller's.
    pub async fn start_scheduler(&self, configuration: &str) -> Result<(), Error> {
        let mut config: Value = serde_yaml_ng::from_str(configuration)
            .map_err(|e| Error::Config(format!("scheduler configuration: {e}")))?;
        let Some(object) = config.as_object_mut() else {
            return Err(Error::Config(
                "scheduler configuration must be a YAML mapping".into(),
            ));
        };
        object
            .entry("apiVersion")
            .or_insert(json!("kubescheduler.config.k8s.io/v1"));
        object
            .entry("kind")
            .or_insert(json!("KubeSchedulerConfiguration"));
        object.insert(
            "clientConnection".into(),
            json!({"kubeconfig": self.kubeconfig(), "qps": 500, "burst": 1000}),
        );
        object
            .entry("leaderElection")
            .or_insert(json!({"leaderElect": false}));
        let path = self.dir.join("kube-scheduler.yaml");
        let yaml = serde_yaml_ng::to_string(&config).map_err(|e| Error::Config(e.to_string()))?;
        fs::write(&path, yaml).map_err(Error::io("write", &path))?;

        let port = free_port()?;
        let mut args = self.component_flags(port);
        args.push(format!("--config={}", path.display()));
        self.spawn("kube-scheduler", &tools::binary("kube-scheduler")?, &args)?;
        self.wait_ready(
            "kube-scheduler /healthz",
            Some((&format!("https://127.0.0.1:{port}"), "/healthz")),
        )
        .await
    }

    /// Starts kube-controller-manager (garbage collection, namespaces,
    /// service accounts, ...) and waits until it is healthy.
    pub async fn start_controller_manager(&self) -> Result<(), Error> {
        let port = free_port()?;
        let kubeconfig = self.kubeconfig().display().to_string();
        let mut args = self.component_flags(port);
        args.extend([
            format!("--kubeconfig={kubeconfig}"),
            "--leader-elect=false".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_key.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
            "--kube-api-qps=500".to_owned(),
            "--kube-api-burst=1000".to_owned(),
        ]);
        self.spawn(
            "kube-controller-manager",
            &tools::binary("kube-controller-manager")?,
            &args,
        )?;
        self.wait_ready(
            "kube-controller-manager /healthz",
            Some((&format!("https://127.0.0.1:{port}"), "/healthz")),
        )
        .await
    }

    /// Flags every secure Kubernetes component takes: delegated authn/authz
    /// through the admin kubeconfig, and our serving certificate on `port`.
    fn component_flags(&self, port: u16) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        let kubeconfig = path(self.kubeconfig());
        vec![
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", path(&self.pki.serving_cert)),
            format!("--tls-private-key-file={}", path(&self.pki.serving_key)),
            "--v=1".to_owned(),
        ]
    }
}
