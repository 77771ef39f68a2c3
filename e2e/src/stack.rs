//! Tessera's control-plane side as a user deploys it, on a [`ControlPlane`]:
//! the `tessera-controller` binary (extender, webhook and lifecycle
//! controllers), its MutatingWebhookConfiguration, kube-scheduler with the
//! extender, and kube-controller-manager (Jobs, garbage collection).

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::artifacts::Artifacts;
use crate::process::Process;
use crate::{control_plane::ControlPlane, error::Error, net::free_port};

/// The scheduler profile GPU pods are sent to (the webhook sets it).
pub const SCHEDULER_NAME: &str = "tessera-scheduler";

/// The webhook's matchCondition: a container or init container names one of
/// Tessera's GPU resources in limits or requests (docs/configuration.md).
pub const GPU_POD_CONDITION: &str = "(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, k in ['nvidia.com/gpu', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage', 'nvidia.com/gpucores', 'nvidia.com/priority'])) || (has(c.resources.requests) && c.resources.requests.exists(k, k in ['nvidia.com/gpu', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage', 'nvidia.com/gpucores', 'nvidia.com/priority']))))";

/// kube-scheduler's configuration: the default profile for other pods, and
/// `tessera-scheduler` with only the extender scoring, binding through it.
/// The extender is asked only about pods naming its resources. kube-scheduler
/// ignores `nvidia.com/gpu` too, as the chart's configuration does: the
/// kubelet publishes a dead plugin's withdrawn devices only at its next node
/// status update (10 s), too late to help and late again when the agent is
/// back (docs/install.md, "When a node agent dies"); the extender knows sooner.
/// Pods it turns away are retried on Node changes (the `Extender` pseudo
/// plugin of kube-scheduler v1.36 asks for every Node event), which is why
/// the extender annotates a Node `tessera.dev/gpu-freed` when capacity
/// appears there.
pub fn scheduler_config(extender_port: u16) -> String {
    scheduler_config_for(
        extender_port,
        &tessera_scheduling::request::RequestConfig::default().resource_names(),
    )
}

/// [`scheduler_config`] with `resources` as the extender's
/// `managedResources` (every family's names: kube-scheduler calls the
/// extender only for pods that ask for one of them).
pub fn scheduler_config_for(extender_port: u16, resources: &[&str]) -> String {
    let managed: String = resources
        .iter()
        .map(|name| format!("  - {{name: {name}, ignoredByScheduler: true}}\n"))
        .collect();
    format!(
        r#"
profiles:
- schedulerName: default-scheduler
- schedulerName: {SCHEDULER_NAME}
  plugins:
    score:
      disabled: [{{name: "*"}}]
extenders:
- urlPrefix: http://127.0.0.1:{extender_port}
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  preemptVerb: preempt
  weight: 1
  enableHTTPS: false
  nodeCacheCapable: true
  httpTimeout: 30s
  managedResources:
{managed}"#
    )
}

/// The MutatingWebhookConfiguration for a webhook at `url`, signed by `ca`
/// (PEM): failurePolicy Fail, and only GPU pods are sent.
pub fn webhook_configuration(url: &str, ca: &[u8]) -> serde_json::Value {
    use base64::Engine;
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "tessera"},
        "webhooks": [{
            "name": "pods.tessera.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {"url": url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "matchConditions": [{"name": "asks-for-gpu-slices", "expression": GPU_POD_CONDITION}],
        }],
    })
}

/// How `tessera-controller` runs: a component of the control plane (stopped,
/// and detached, with it).
#[derive(Debug)]
pub struct Tessera {
    program: std::path::PathBuf,
    args: Vec<String>,
    kubeconfig: String,
    /// The extender's port on 127.0.0.1 (also serves `/metrics`).
    pub extender_port: u16,
}

/// The controller's component name.
const CONTROLLER: &str = "tessera-controller";

impl Tessera {
    /// Starts the controller, registers its webhook, then starts
    /// kube-scheduler with the extender and kube-controller-manager.
    pub async fn deploy(plane: &ControlPlane, artifacts: &Artifacts) -> Result<Self, Error> {
        let tessera = Self::deploy_scheduling(plane, artifacts).await?;
        plane.start_controller_manager().await?;
        Ok(tessera)
    }

    /// [`Tessera::deploy`] without kube-controller-manager: for simulated
    /// nodes that send no heartbeats (the scale bench), whose pods its node
    /// lifecycle controller would evict.
    pub async fn deploy_scheduling(
        plane: &ControlPlane,
        artifacts: &Artifacts,
    ) -> Result<Self, Error> {
        Self::deploy_scheduling_with(plane, artifacts, &[]).await
    }

    /// [`Tessera::deploy_scheduling`] with `extra` flags for the controller
    /// (for example `--profiling`).
    pub async fn deploy_scheduling_with(
        plane: &ControlPlane,
        artifacts: &Artifacts,
        extra: &[String],
    ) -> Result<Self, Error> {
        let extender_port = free_port()?;
        let webhook_port = free_port()?;
        let pki = plane.pki();
        let args: Vec<String> = [
            format!("--extender-addr=127.0.0.1:{extender_port}"),
            format!("--webhook-addr=127.0.0.1:{webhook_port}"),
            // Not the default 0.0.0.0:9395: several controllers may run here.
            format!("--metrics-addr=127.0.0.1:{}", free_port()?),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-key-file={}", pki.serving_key.display()),
            "--lease-namespace=kube-system".to_owned(),
        ]
        .into_iter()
        .chain(extra.iter().cloned())
        .collect();
        let tessera = Self {
            program: artifacts.controller.clone(),
            args,
            kubeconfig: plane.kubeconfig().display().to_string(),
            extender_port,
        };
        tessera.start(plane).await?;
        let ca = std::fs::read(&pki.ca_cert).map_err(Error::io("read", &pki.ca_cert))?;
        let configuration =
            webhook_configuration(&format!("https://127.0.0.1:{webhook_port}/mutate"), &ca);
        let api: Api<MutatingWebhookConfiguration> = Api::all(plane.client().await?);
        api.patch(
            "tessera",
            &PatchParams::apply("tessera-e2e").force(),
            &Patch::Apply(configuration),
        )
        .await?;
        plane
            .start_scheduler(&scheduler_config(extender_port))
            .await?;
        Ok(tessera)
    }

    /// Starts the controller (again, after [`Tessera::stop`]) and waits
    /// until its extender is ready.
    pub async fn start(&self, plane: &ControlPlane) -> Result<(), Error> {
        let mut controller = Process::spawn_with_env(
            CONTROLLER,
            &self.program,
            &self.args,
            &[("KUBECONFIG", &self.kubeconfig), ("TESSERA_LOG", "info")],
            plane.dir().join(format!("{CONTROLLER}.log")),
            plane.lifetime,
        )?;
        let addr = format!("127.0.0.1:{}", self.extender_port);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !crate::http::get_ok(&addr, "/readyz").await {
            controller.check_running()?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "tessera-controller's extender to be ready".into(),
                    seconds: 30,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        plane.adopt(controller);
        Ok(())
    }

    /// The controller's pid, while it runs.
    pub fn pid(&self, plane: &ControlPlane) -> Option<u32> {
        plane
            .pids()
            .into_iter()
            .rev()
            .find(|(name, _)| name == CONTROLLER)
            .map(|(_, pid)| pid)
    }

    /// Stops the controller.
    pub fn stop(&self, plane: &ControlPlane) {
        plane.stop_component(CONTROLLER);
    }
}
