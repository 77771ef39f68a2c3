//! The DevicePlugin gRPC service the kubelet calls.

use std::{path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use tessera_api::v1alpha1::{NodeLock, ServedMigInstance, VgpuAllocation};
use tessera_deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, DevicePluginOptions, Empty, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
    device_plugin_server::DevicePlugin,
};
use tokio::sync::{Mutex, watch};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::modes::Modes;
use super::{
    allocate::{Grant, answer, grant, preferred},
    device_list::DeviceList,
    ids::device_list,
    served::Served,
    server::{DeviceStream, Plugin, device_stream},
};
use crate::contract::HostPaths;
use crate::{Error, offer::Offer, sharing::Mode, view::NodeView};

/// What the service needs.
#[derive(Clone)]
pub struct Service {
    view: NodeView,
    offers: watch::Receiver<Offer>,
    paths: HostPaths,
    list: DeviceList,
    /// How each sharing mode serves a container.
    modes: Modes,
    /// Allocate calls are served one at a time.
    serving: Arc<Mutex<()>>,
    /// Containers answered, by pod UID, on disk before each answer: the
    /// allocation may come from a watch that has not yet seen the status
    /// write, and an agent restarted before that write must not answer the
    /// same container again for the pod's next one.
    served: Served,
}

/// How long an Allocate waits for the previous one's writes.
const TURN_WAIT: Duration = Duration::from_secs(10);

/// How long GetPreferredAllocation looks for the lock before answering
/// without a preference.
const PREFERENCE_WAIT: Duration = Duration::from_secs(1);

/// The options the agent registers with.
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

impl Plugin for Service {
    fn options(&self) -> DevicePluginOptions {
        options()
    }
}

impl Service {
    /// A service for the node `view` watches, offering `offers`, passing
    /// devices to the container runtime as `list` says, keeping the
    /// containers it answers in `served` ([`Served::open`] in the agent's
    /// state directory).
    pub fn new(
        view: NodeView,
        offers: watch::Receiver<Offer>,
        paths: HostPaths,
        list: DeviceList,
        modes: Modes,
        served: Served,
    ) -> Self {
        Self {
            view,
            offers,
            paths,
            list,
            modes,
            serving: Arc::default(),
            served,
        }
    }

    /// Decides which container is asked for and serves it in its sharing
    /// mode; returns the answer and what to write back ([`Followup`]).
    async fn serve(
        &self,
        requested: &[String],
    ) -> Result<(ContainerAllocateResponse, Followup), Error> {
        let lock = self.view.lock().await?;
        let mut allocation = match &lock {
            Some(lock) => self.view.allocation(lock).await?,
            None => None,
        };
        if let Some(allocation) = &mut allocation {
            self.overlay(allocation);
        }
        let span = allocate_span(self.view.node(), requested, allocation.as_ref());
        self.serve_in(requested, lock, allocation)
            .instrument(span)
            .await
    }

    /// [`Self::serve`] with the node's lock and the allocation it names read.
    async fn serve_in(
        &self,
        requested: &[String],
        lock: Option<NodeLock>,
        allocation: Option<VgpuAllocation>,
    ) -> Result<(ContainerAllocateResponse, Followup), Error> {
        let node = self.view.node();
        let grant = grant(
            node,
            lock.as_ref(),
            allocation.as_ref(),
            requested,
            &self.paths,
        )?;
        // `grant` succeeds only with both; this keeps the types honest.
        let (Some(lock), Some(allocation)) = (lock, allocation) else {
            return Err(crate::error::AllocateError::NoLock { node: node.into() }.into());
        };
        // The lock may lapse, or name a pod deleted and recreated under
        // its name, or bound elsewhere: then the pod asking is not its holder.
        super::lock_checks::unexpired(&lock, k8s_openapi::jiff::Timestamp::now())?;
        let pod = self.view.holder_pod(&lock).await?;
        super::lock_checks::holder_bound_here(&lock, pod.as_ref(), node)?;
        let answered_here = !self.served.of(&allocation.spec.pod_uid).is_empty();
        super::served::known(&lock, &allocation, answered_here, self.served.uncertain())?;
        if !grant.mismatched.is_empty() {
            tracing::warn!(pod = %grant.allocation, chosen = ?grant.mismatched, "the kubelet chose other GPUs than preferred; the allocation's GPUs are used");
        }
        let settings = self.offers.borrow().resolved.settings.clone();
        let container = grant.to_serve(&settings);
        let mode = Mode::of_container(&container.slices, &settings);
        let serving = self.modes.serving(mode);
        let contract = tokio::task::spawn_blocking(move || serving.serve(&container))
            .await
            .map_err(|e| Error::Serving(format!("the task serving it stopped: {e}")))??;
        tracing::info!(
            namespace = %grant.namespace,
            pod = %grant.allocation,
            container = %grant.container,
            ?mode,
            devices = %contract.visible.join(","),
            last = grant.last,
            "served Allocate"
        );
        let followup = Followup {
            allocation,
            lock,
            mig_instances: contract.mig_instances.clone(),
            unsynced: contract.unsynced.clone(),
            grant,
        };
        Ok((
            answer(contract, &self.list, &followup.grant.pod_uid),
            followup,
        ))
    }

    /// Adds the containers this agent answered to the allocation's served list.
    fn overlay(&self, allocation: &mut VgpuAllocation) {
        let ours = self.served.of(&allocation.spec.pod_uid);
        if ours.is_empty() {
            return;
        }
        let status = allocation.status.get_or_insert_with(Default::default);
        for container in ours {
            if !status.served_containers.contains(&container) {
                status.served_containers.push(container);
            }
        }
    }

    /// Notes the container as answered, on disk, before the kubelet gets the
    /// answer: whatever happens to the status write, and across a restart of
    /// the agent, the pod's next Allocate serves its next container. Whether
    /// it was written: if not, the status must be written before answering.
    async fn remember(&self, followup: &Followup) -> bool {
        let served = self.served.clone();
        let uid = followup.allocation.spec.pod_uid.clone();
        let container = followup.grant.container.clone();
        let kept = tokio::task::spawn_blocking(move || served.add(&uid, &container))
            .await
            .unwrap_or_else(|e| Err(Error::Serving(format!("the task keeping it stopped: {e}"))));
        match kept {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, pod = %followup.grant.allocation, container = %followup.grant.container, "could not keep the answered container on disk; recording it in the allocation before answering");
                false
            }
        }
    }

    /// Records the container as served; after the pod's last one the
    /// allocation's `Allocated` phase is what releases the node's lock
    /// (`NodeLock::released_by`). Retried, because until it is done the node
    /// stays locked (the lifecycle controller also marks the allocation
    /// `Allocated` once the pod runs).
    async fn finish(&self, followup: &Followup) {
        // The files the container was given are on disk before it is
        // recorded as served.
        let unsynced = followup.unsynced.clone();
        let synced = match unsynced.is_empty() {
            true => Ok(Ok(())),
            false => {
                tokio::task::spawn_blocking(move || {
                    unsynced
                        .iter()
                        .try_for_each(|file| crate::install::sync_in_place(file))
                })
                .await
            }
        };
        match synced {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(%error, pod = %followup.grant.allocation, "a served container's file may not survive a crash of the node");
            }
            Err(error) => {
                tracing::error!(%error, pod = %followup.grant.allocation, "the task syncing a served container's files stopped");
            }
        }
        let holder = &followup.lock.spec.holder.uid;
        let mut allocation = followup.allocation.clone();
        for attempt in 0..5u32 {
            if attempt > 0 {
                // Read it again: the conflict may be a newer version than ours.
                match self.view.allocation_from_api(&followup.lock).await {
                    Ok(Some(fresh)) if fresh.spec.pod_uid == *holder && !fresh.is_live() => {
                        // Released meanwhile (the pod finished or was deleted):
                        // writing `Allocated` now would bring its slices back
                        // into the ledger after they were handed out again.
                        tracing::info!(pod = %followup.grant.allocation, "allocation released before it was recorded");
                        return;
                    }
                    Ok(Some(fresh)) if fresh.spec.pod_uid == *holder => allocation = fresh,
                    Ok(_) => {
                        // Deleted, or replaced by a new pod of the same name.
                        // The lifecycle controller deletes the lock of a deleted holder.
                        tracing::info!(pod = %followup.grant.allocation, "allocation gone before it was recorded (pod deleted)");
                        return;
                    }
                    Err(error) => tracing::warn!(%error, "re-reading the allocation failed"),
                }
            }
            let result = self
                .record(&allocation, &followup.grant, &followup.mig_instances)
                .await;
            match result {
                Ok(()) => {
                    if followup.grant.last {
                        // Fully served: the watch's Allocated phase says it from now on.
                        self.served.forget(holder);
                    }
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "recording an Allocate failed; retrying");
                    // A conflict is usually Bind's own status write: retry at once.
                    if attempt > 0 {
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    }
                }
            }
        }
        tracing::error!(pod = %followup.grant.allocation, "could not record an Allocate; the lock goes when the pod runs or expires");
    }

    /// Adds the container to the allocation's served list (and marks it
    /// Allocated after the last one), guarded by the resourceVersion read.
    async fn record(
        &self,
        allocation: &VgpuAllocation,
        grant: &Grant,
        made: &[ServedMigInstance],
    ) -> Result<(), Error> {
        let Some(status) = super::allocate::served_status(
            allocation,
            grant,
            made,
            Time(crate::whole_seconds_now()),
        ) else {
            // Recorded by an earlier attempt, or released meanwhile.
            return Ok(());
        };
        // Guarded by the version read: the list is built from it.
        let api = Api::<VgpuAllocation>::namespaced(self.view.client().clone(), &grant.namespace);
        let version = allocation.metadata.resource_version.as_deref();
        crate::STATUS
            .apply_at(&api, &grant.allocation, version, &status)
            .await
            .map_err(Error::kube(format!(
                "recording container {} as served in VgpuAllocation {}/{}",
                grant.container, grant.namespace, grant.allocation
            )))?;
        Ok(())
    }
}

fn status(error: &Error) -> Status {
    match error {
        Error::Allocate(_) => Status::failed_precondition(error.to_string()),
        _ => Status::unavailable(error.to_string()),
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let stream = device_stream(self.offers.clone(), |offer| device_list(&offer.devices));
        Ok(Response::new(stream))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        // A preference is only advice (Allocate serves the allocation's
        // GPUs whatever the kubelet chose), so it waits neither for an
        // Allocate's writes in flight (this pod's previous containers are
        // already remembered, see `overlay`) nor through an API outage: the
        // kubelet holds the pod's admission on this call, and an agent
        // restarted meanwhile would lose the pod for good.
        let looked_up = tokio::time::timeout(PREFERENCE_WAIT, async {
            let Some(lock) = self.view.lock_once().await? else {
                return Ok::<_, Error>((None, None));
            };
            let mut allocation = self.view.allocation(&lock).await.ok().flatten();
            if let Some(allocation) = &mut allocation {
                self.overlay(allocation);
            }
            Ok((Some(lock), allocation))
        })
        .await;
        let (lock, allocation) = match looked_up {
            Ok(Ok(found)) => found,
            Ok(Err(error)) => {
                tracing::warn!(%error, "GetPreferredAllocation without a preference");
                (None, None)
            }
            Err(_) => {
                tracing::warn!(
                    waited_ms = PREFERENCE_WAIT.as_millis(),
                    "GetPreferredAllocation without a preference: the API server is slow"
                );
                (None, None)
            }
        };
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let device_ids = preferred(
                    lock.as_ref(),
                    allocation.as_ref(),
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    size,
                )
                .unwrap_or_else(|| {
                    // Nothing to steer by: any available devices will do.
                    let mut ids = c.must_include_device_i_ds.clone();
                    ids.extend(
                        c.available_device_i_ds
                            .iter()
                            .filter(|id| !c.must_include_device_i_ds.contains(id))
                            .take(size.saturating_sub(ids.len()))
                            .cloned(),
                    );
                    ids
                });
                ContainerPreferredAllocationResponse {
                    device_i_ds: device_ids,
                }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        // One Allocate at a time, and the next one only after the previous
        // one's writes: it may be the same pod's next container.
        let turn = tokio::time::timeout(TURN_WAIT, self.serving.clone().lock_owned())
            .await
            .map_err(|_| {
                Status::unavailable(format!(
                    "the previous Allocate's writes are still pending after {} s; the kubelet will retry",
                    TURN_WAIT.as_secs()
                ))
            })?;
        let requests = request.into_inner().container_requests;
        let count = requests.len();
        let mut container_responses = Vec::new();
        for (i, container) in requests.into_iter().enumerate() {
            let (answer, followup) = self.serve(&container.devices_ids).await.map_err(|error| {
                tracing::warn!(%error, "Allocate refused");
                status(&error)
            })?;
            let kept = self.remember(&followup).await;
            if i + 1 < count || (!kept && !followup.grant.last) {
                self.finish(&followup).await;
            } else {
                // The kubelet gets its answer now; the writes follow at once,
                // holding this turn so the next Allocate sees them.
                let service = self.clone();
                tokio::spawn(async move {
                    let _turn = turn;
                    service.finish(&followup).await;
                });
                container_responses.push(answer);
                break;
            }
            container_responses.push(answer);
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// What an Allocate still has to write once the kubelet has its answer.
struct Followup {
    allocation: VgpuAllocation,
    lock: NodeLock,
    grant: Grant,
    /// The container's files in place but not yet on disk.
    unsynced: Vec<PathBuf>,
    /// The MIG instances made for the container.
    mig_instances: Vec<ServedMigInstance>,
}

/// The `allocate` span of one container, in the trace the scheduler's Bind
/// started for its pod (the context stored on the allocation), with the
/// pod's namespace, name and UID when the allocation is found. Joined
/// before it is entered: a started span keeps the parent it started with.
fn allocate_span(
    node: &str,
    requested: &[String],
    allocation: Option<&VgpuAllocation>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "allocate",
        k8s.node.name = node,
        k8s.namespace.name = allocation.and_then(|a| a.metadata.namespace.as_deref()).unwrap_or_default(),
        k8s.pod.name = allocation.and_then(|a| a.metadata.name.as_deref()).unwrap_or_default(),
        k8s.pod.uid = allocation.map(|a| a.spec.pod_uid.as_str()).unwrap_or_default(),
        devices = %requested.join(","),
    );
    if let Some(stored) = allocation.and_then(|a| a.spec.trace_context.as_ref()) {
        tessera_telemetry::join(&span, stored);
    }
    span
}
