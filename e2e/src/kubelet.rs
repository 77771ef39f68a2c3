//! A kubelet simulator: the kubelet's device manager for one node, speaking
//! the real device-plugin protocol, so a plugin cannot tell it from a kubelet.
//!
//! It serves `Registration` on `<dir>/kubelet.sock`; when a plugin registers
//! it connects to the plugin's socket and follows `ListAndWatch`. It watches
//! the pods bound to its node (field selector, as the kubelet does) and
//! admits them one at a time in the order they arrive: for every container
//! asking for the resource (init containers first) it picks free healthy
//! device IDs, asks `GetPreferredAllocation`, calls `Allocate`, and records
//! the answer where tests can read it. Admitted pods are marked Running; a
//! refused Allocate fails the pod with `UnexpectedAdmissionError`, as the
//! kubelet does. Deleted pods free their devices (and a pod being deleted
//! is confirmed gone, as the kubelet does once its containers stop).
//! [`KubeletSim::restart`] removes every socket and serves a new
//! kubelet.sock, like a kubelet restart.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tessera_deviceplugin::{
    HEALTHY, KUBELET_SOCKET, VERSION, connect_unix,
    v1beta1::{
        AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
        DevicePluginOptions, Empty, PreferredAllocationRequest, RegisterRequest,
        device_plugin_client::DevicePluginClient,
        registration_server::{Registration, RegistrationServer},
    },
};
use tokio::{sync::watch, task::JoinHandle};
use tokio_stream::wrappers::UnixListenerStream;

use crate::error::Error;

/// One container the plugin served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The device IDs the simulator passed to Allocate.
    pub device_ids: Vec<String>,
    /// The environment the plugin answered.
    pub envs: BTreeMap<String, String>,
    /// The mounts the plugin answered: (container path, host path, read-only).
    pub mounts: Vec<(String, String, bool)>,
}

/// What the simulator has seen; tests read it through [`KubeletSim::state`].
#[derive(Clone, Debug, Default)]
pub struct SimState {
    /// How many times a plugin registered.
    pub registrations: usize,
    /// The registered plugin's socket name and options.
    pub plugin: Option<(String, DevicePluginOptions)>,
    /// The plugin's devices by ID, with their health.
    pub devices: BTreeMap<String, String>,
    /// Every container served, in order.
    pub served: Vec<Served>,
    /// Pods whose admission failed: (namespace/name, the plugin's error).
    pub failures: Vec<(String, String)>,
    /// Device IDs held by each admitted pod (by UID).
    assigned: HashMap<String, Vec<String>>,
    /// Pods already admitted or refused (by UID).
    handled: HashSet<String>,
}

struct Shared {
    client: Client,
    node: String,
    dir: PathBuf,
    resource: String,
    state: Mutex<SimState>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn update<R>(&self, f: impl FnOnce(&mut SimState) -> R) -> R {
        let result = f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.send_modify(|g| *g += 1);
        result
    }

    fn snapshot(&self) -> SimState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A simulated kubelet for one node. Dropping it stops it.
pub struct KubeletSim {
    shared: Arc<Shared>,
    server: Mutex<Option<JoinHandle<()>>>,
    pods: JoinHandle<()>,
}

impl Drop for KubeletSim {
    fn drop(&mut self) {
        self.pods.abort();
        if let Some(server) = self.server.lock().unwrap_or_else(|e| e.into_inner()).take() {
            server.abort();
        }
    }
}

impl KubeletSim {
    /// Starts serving `<dir>/kubelet.sock` for `node`, handing out `resource`.
    pub async fn start(
        client: Client,
        node: &str,
        dir: &Path,
        resource: &str,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(Error::io("creating the device-plugin dir", dir))?;
        let shared = Arc::new(Shared {
            client,
            node: node.to_owned(),
            dir: dir.to_owned(),
            resource: resource.to_owned(),
            state: Mutex::default(),
            changed: watch::channel(0).0,
        });
        let server = serve_registration(shared.clone())?;
        let pods = tokio::spawn(admit_pods(shared.clone()));
        Ok(Self {
            shared,
            server: Mutex::new(Some(server)),
            pods,
        })
    }

    /// The device-plugin directory (holds kubelet.sock).
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// What the simulator has seen so far.
    pub fn state(&self) -> SimState {
        self.shared.snapshot()
    }

    /// Waits until `check` holds for the state, or fails after `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&SimState) -> bool,
    ) -> Result<SimState, Error> {
        let mut changes = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let state = self.shared.snapshot();
            if check(&state) {
                return Ok(state);
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Err(Error::Timeout {
                    seconds: timeout.as_secs(),
                    what: what.to_owned(),
                });
            }
        }
    }

    /// Restarts like a kubelet: every socket in the directory is removed
    /// (the plugin's too) and a new kubelet.sock is served; the plugin must
    /// register again.
    pub fn restart(&self) -> Result<(), Error> {
        if let Some(server) = self.server.lock().unwrap_or_else(|e| e.into_inner()).take() {
            server.abort();
        }
        let entries = std::fs::read_dir(&self.shared.dir)
            .map_err(Error::io("reading the device-plugin dir", &self.shared.dir))?;
        for entry in entries.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        self.shared.update(|s| {
            s.plugin = None;
            s.devices.clear();
        });
        let server = serve_registration(self.shared.clone())?;
        *self.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
        Ok(())
    }
}

struct Registrar {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(
        &self,
        request: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let request = request.into_inner();
        if request.version != VERSION {
            return Err(tonic::Status::invalid_argument(format!(
                "unsupported device-plugin API version {}",
                request.version
            )));
        }
        if request.resource_name != self.shared.resource {
            return Err(tonic::Status::invalid_argument(format!(
                "this kubelet hands out {}, not {}",
                self.shared.resource, request.resource_name
            )));
        }
        let options = request.options.unwrap_or_default();
        let endpoint = request.endpoint.clone();
        self.shared.update(|s| {
            s.registrations += 1;
            s.plugin = Some((endpoint.clone(), options));
        });
        tokio::spawn(follow_devices(self.shared.clone(), endpoint));
        Ok(tonic::Response::new(Empty {}))
    }
}

fn serve_registration(shared: Arc<Shared>) -> Result<JoinHandle<()>, Error> {
    let path = shared.dir.join(KUBELET_SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)
        .map_err(Error::io("listening on kubelet.sock", &path))?;
    Ok(tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Registrar { shared }))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
        if let Err(error) = result {
            tracing::warn!(%error, "kubelet simulator's registration server stopped");
        }
    }))
}

/// Follows the plugin's ListAndWatch until the stream ends.
async fn follow_devices(shared: Arc<Shared>, endpoint: String) {
    let Ok(channel) = connect_unix(&shared.dir.join(&endpoint)).await else {
        tracing::warn!(endpoint, "kubelet simulator cannot reach the plugin");
        return;
    };
    let Ok(response) = DevicePluginClient::new(channel)
        .list_and_watch(Empty {})
        .await
    else {
        return;
    };
    let mut stream = response.into_inner();
    while let Some(Ok(list)) = stream.next().await {
        shared.update(|s| {
            if s.plugin.as_ref().is_some_and(|(e, _)| *e == endpoint) {
                s.devices = list.devices.into_iter().map(|d| (d.id, d.health)).collect();
            }
        });
    }
}

/// Watches the node's pods and admits new ones, one at a time.
async fn admit_pods(shared: Arc<Shared>) {
    let pods: Api<Pod> = Api::all(shared.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", shared.node));
    let mut events = watcher(pods, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let pods = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => vec![pod],
            Ok(watcher::Event::Delete(pod)) => {
                free(&shared, &pod);
                continue;
            }
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, "kubelet simulator's pod watch failed; retrying");
                continue;
            }
        };
        for pod in pods {
            if pod.metadata.deletion_timestamp.is_some() {
                free(&shared, &pod);
                confirm_deletion(&shared, &pod).await;
                continue;
            }
            let uid = pod.uid().unwrap_or_default();
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            let fresh = shared.update(|s| s.handled.insert(uid.clone()));
            if fresh && !matches!(phase, Some("Succeeded" | "Failed")) {
                admit(&shared, &pod).await;
            }
        }
    }
}

fn free(shared: &Shared, pod: &Pod) {
    let uid = pod.uid().unwrap_or_default();
    shared.update(|s| s.assigned.remove(&uid));
}

async fn confirm_deletion(shared: &Shared, pod: &Pod) {
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let params = DeleteParams::default()
        .grace_period(0)
        .preconditions(kube::api::Preconditions {
            uid: pod.uid(),
            resource_version: None,
        });
    let _ = api.delete(&pod.name_any(), &params).await;
}

fn wanted(container: &Container, resource: &str) -> usize {
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let requests = container
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref());
    limits
        .and_then(|l| l.get(resource))
        .or_else(|| requests.and_then(|r| r.get(resource)))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

/// Admits one pod: Allocate for each container that asks for the resource.
async fn admit(shared: &Shared, pod: &Pod) {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for container in containers {
        let count = wanted(container, &shared.resource);
        if count == 0 {
            continue;
        }
        match allocate(shared, &uid, count).await {
            Ok((ids, response)) => {
                let served = Served {
                    namespace: namespace.clone(),
                    pod: name.clone(),
                    container: container.name.clone(),
                    device_ids: ids,
                    envs: response.envs.into_iter().collect(),
                    mounts: response
                        .mounts
                        .into_iter()
                        .map(|m| (m.container_path, m.host_path, m.read_only))
                        .collect(),
                };
                shared.update(|s| s.served.push(served));
            }
            Err(message) => {
                shared.update(|s| {
                    s.failures
                        .push((format!("{namespace}/{name}"), message.clone()))
                });
                set_phase(
                    shared,
                    pod,
                    "Failed",
                    Some(("UnexpectedAdmissionError", message)),
                )
                .await;
                free(shared, pod);
                return;
            }
        }
    }
    set_phase(shared, pod, "Running", None).await;
}

/// Picks devices, asks the plugin's preference, and calls Allocate.
async fn allocate(
    shared: &Shared,
    uid: &str,
    count: usize,
) -> Result<
    (
        Vec<String>,
        tessera_deviceplugin::v1beta1::ContainerAllocateResponse,
    ),
    String,
> {
    // Wait briefly for a plugin with devices, as pods may arrive first.
    let mut changes = shared.changed.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (endpoint, options, available) = loop {
        let state = shared.snapshot();
        let taken: HashSet<&String> = state.assigned.values().flatten().collect();
        let available: Vec<String> = state
            .devices
            .iter()
            .filter(|(id, health)| *health == HEALTHY && !taken.contains(id))
            .map(|(id, _)| id.clone())
            .collect();
        if let Some((endpoint, options)) = &state.plugin
            && available.len() >= count
        {
            break (endpoint.clone(), *options, available);
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return Err(format!(
                "insufficient {}: want {count}, {} free",
                shared.resource,
                available.len()
            ));
        }
    };
    let channel = connect_unix(&shared.dir.join(&endpoint))
        .await
        .map_err(|e| format!("connecting to the plugin: {e}"))?;
    let mut plugin = DevicePluginClient::new(channel);
    let mut chosen: Vec<String> = available.iter().take(count).cloned().collect();
    if options.get_preferred_allocation_available {
        let preferred = plugin
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.clone(),
                    must_include_device_i_ds: Vec::new(),
                    allocation_size: i32::try_from(count).unwrap_or(i32::MAX),
                }],
            })
            .await
            .map_err(|s| format!("GetPreferredAllocation: {}", s.message()))?
            .into_inner();
        if let Some(ids) = preferred
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            && ids.len() == count
            && ids.iter().all(|id| available.contains(id))
        {
            chosen = ids;
        }
    }
    shared.update(|s| {
        s.assigned
            .entry(uid.to_owned())
            .or_default()
            .extend(chosen.clone())
    });
    let response = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        })
        .await
        .map_err(|s| s.message().to_owned())?
        .into_inner();
    let container = response
        .container_responses
        .into_iter()
        .next()
        .ok_or_else(|| "Allocate answered no container".to_owned())?;
    Ok((chosen, container))
}

async fn set_phase(shared: &Shared, pod: &Pod, phase: &str, reason: Option<(&str, String)>) {
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let ready = if phase == "Running" { "True" } else { "False" };
    let mut status = json!({
        "phase": phase,
        "conditions": [{"type": "Ready", "status": ready}],
    });
    if let Some((reason, message)) = reason {
        status["reason"] = json!(reason);
        status["message"] = json!(message);
    }
    if let Err(error) = api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
    {
        tracing::warn!(%error, pod = %pod.name_any(), "kubelet simulator could not set the pod phase");
    }
}
