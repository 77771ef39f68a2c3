//! The kubelet's DRA plugin service: NodePrepareResources and
//! NodeUnprepareResources for claims allocated from this node's pool.
//!
//! Preparing a claim reads it from the API server (the kubelet sends only
//! its namespace, name and UID), writes its CDI spec into the CDI directory
//! containerd reads, creates the region directory of each request and
//! records the claim in the ledger as a mirror VgpuAllocation (Allocated).
//! Unpreparing removes the CDI spec and marks the mirror Released. Both are
//! idempotent: the kubelet repeats them after its own restarts and after
//! errors, and the agent keeps no state of its own (the CDI files and the
//! mirrors are the state, both survive an agent restart).

use std::path::PathBuf;

use k8s_openapi::{api::resource::v1::ResourceClaim, apimachinery::pkg::apis::meta::v1::Time};
use kube::Api;
use tessera_api::v1alpha1::{AllocationPhase, VgpuAllocation, VgpuAllocationStatus};
use tessera_draplugin::dra::v1::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
    dra_plugin_server::DraPlugin,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{
    claim_gpus, mirror, mirror_name,
    prepare::{cdi_spec_of, claim_error, prepared_devices, request_containers},
};
use crate::{
    Error,
    contract::HostPaths,
    offer::Offer,
    sharing::{HamiCore, Serving},
    view::NodeView,
};

/// The DRA plugin service of one node.
#[derive(Clone)]
pub struct DraService {
    view: NodeView,
    offers: watch::Receiver<Offer>,
    paths: HostPaths,
    cdi_dir: PathBuf,
}

impl DraService {
    /// Prepares claims from `offers` (the node's real offer, not the device
    /// plugin's), writing CDI specs into `cdi_dir`.
    pub fn new(
        view: NodeView,
        offers: watch::Receiver<Offer>,
        paths: HostPaths,
        cdi_dir: PathBuf,
    ) -> Self {
        Self {
            view,
            offers,
            paths,
            cdi_dir,
        }
    }

    /// The CDI spec file of claim `uid`, or an error for a UID that is not
    /// one file name (UIDs come from the API server, but the path is built
    /// from what the kubelet sent).
    fn cdi_file(&self, uid: &str) -> Result<PathBuf, Error> {
        if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(Error::Dra(format!(
                "claim UID {uid:?} is not a UID (letters, digits and '-')"
            )));
        }
        Ok(self.cdi_dir.join(format!("tessera.dev-vgpu_{uid}.json")))
    }

    async fn prepare(&self, claim: &Claim) -> Result<NodePrepareResourceResponse, Error> {
        let file = self.cdi_file(&claim.uid)?;
        let api = Api::<ResourceClaim>::namespaced(self.view.client().clone(), &claim.namespace);
        let object = api.get(&claim.name).await.map_err(Error::kube(format!(
            "reading ResourceClaim {}/{}",
            claim.namespace, claim.name
        )))?;
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(claim_error(
                &object,
                format!(
                    "has UID {:?}, not {:?}: the claim the kubelet asked for is gone",
                    object.metadata.uid.clone().unwrap_or_default(),
                    claim.uid
                ),
            ));
        }
        let span = prepare_span(self.view.node(), &object);
        self.prepare_in(claim, &file, &object)
            .instrument(span)
            .await
    }

    /// [`Self::prepare`] with the claim read and checked, in its span.
    async fn prepare_in(
        &self,
        claim: &Claim,
        file: &std::path::Path,
        object: &ResourceClaim,
    ) -> Result<NodePrepareResourceResponse, Error> {
        let node = self.view.node();
        let offer = self.offers.borrow().clone();
        let gpus = claim_gpus(object, node, &offer.devices)?;
        let hami_core = HamiCore::new(self.paths.clone());
        let mut contracts = Vec::new();
        for (request, container) in
            request_containers(&claim.uid, &gpus, &offer.resolved.settings, &self.paths)
        {
            contracts.push((request, hami_core.serve(&container)?));
        }
        // Before the claim is recorded as prepared, as the device plugin does.
        for file in contracts.iter().flat_map(|(_, c)| &c.unsynced) {
            crate::install::sync_in_place(file)?;
        }
        let spec = cdi_spec_of(&claim.uid, &contracts);
        // Atomically: containerd never reads half a spec.
        crate::install::replace(file, spec.to_string().as_bytes(), CDI_MODE)
            .map_err(crate::install::step_failed(file))?;
        let mut mirror = mirror(object, node, &gpus)?;
        mirror.spec.trace_context = tessera_telemetry::trace_context();
        self.record(mirror).await?;
        tracing::info!(
            namespace = %claim.namespace,
            claim = %claim.name,
            devices = %gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(","),
            "prepared claim"
        );
        Ok(NodePrepareResourceResponse {
            devices: prepared_devices(&claim.uid, node, &gpus),
            error: String::new(),
        })
    }

    /// Records the mirror in the ledger, Allocated ([`crate::ledger::record`]).
    /// A mirror left from an earlier allocation of the claim (a standalone
    /// claim is deallocated when no pod reserves it, and may be allocated
    /// again elsewhere or to other GPUs) is replaced; an allocation of the
    /// mirror's name that the scheduler wrote is not, and the claim is then
    /// not prepared (its slices would be in no ledger).
    async fn record(&self, mirror: VgpuAllocation) -> Result<(), Error> {
        let name = mirror.metadata.name.clone().unwrap_or_default();
        let recorded = crate::ledger::record(
            self.view.client(),
            mirror,
            "the node agent prepared the claim",
            Vec::new(),
        )
        .await?;
        match recorded {
            crate::ledger::Recorded::Written => Ok(()),
            crate::ledger::Recorded::Kept => Err(Error::Dra(format!(
                "the claim's mirror VgpuAllocation {name} cannot be written: an allocation the scheduler wrote has that name"
            ))),
        }
    }

    /// Removes the claim's CDI spec and marks its mirror Released, saying `why`.
    async fn unprepare(&self, claim: &Claim, why: &str) -> Result<(), Error> {
        let file = self.cdi_file(&claim.uid)?;
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", file.display()))(e)),
        }
        let api = Api::<VgpuAllocation>::namespaced(self.view.client().clone(), &claim.namespace);
        let name = mirror_name(&claim.uid);
        let mirror = api.get_opt(&name).await.map_err(Error::kube(format!(
            "reading VgpuAllocation {}/{name}",
            claim.namespace
        )))?;
        // Only this claim's mirror: a pod may be named `claim-<uid>` too,
        // and its allocation is the scheduler's (review 2026-12-01, L3).
        let this_claims =
            |m: &VgpuAllocation| m.spec.claim.as_ref().is_some_and(|c| c.uid == claim.uid);
        if let Some(mirror) = mirror.filter(|m| m.is_live() && this_claims(m)) {
            let status = VgpuAllocationStatus {
                phase: Some(AllocationPhase::Released),
                released_at: Some(Time(crate::whole_seconds_now())),
                message: Some(why.to_owned()),
                ..mirror.status.clone().unwrap_or_default()
            };
            crate::STATUS
                .apply_at(&api, &name, None, &status)
                .await
                .map_err(Error::kube(format!(
                    "marking VgpuAllocation {}/{name} Released",
                    claim.namespace
                )))?;
        }
        tracing::info!(namespace = %claim.namespace, claim = %claim.name, "unprepared claim");
        Ok(())
    }

    /// Releases, every [`RECONCILE`], the live mirrors whose claim is gone,
    /// is another claim of that name, or no longer holds a device of this
    /// node's pool: the kubelet unprepares a claim only while it knows of
    /// it, so a claim deleted while the kubelet was down, or a kubelet whose
    /// state was wiped, would otherwise leave its mirror holding the GPUs
    /// in the ledger (and the node's door) forever.
    pub async fn reconcile(self) {
        let mut ticks = tokio::time::interval(RECONCILE);
        loop {
            ticks.tick().await;
            for mirror in self.view.allocations() {
                let Some(claim) = mirror.spec.claim.clone().filter(|_| mirror.is_live()) else {
                    continue;
                };
                let namespace = mirror.metadata.namespace.clone().unwrap_or_default();
                let claims =
                    Api::<ResourceClaim>::namespaced(self.view.client().clone(), &namespace);
                let stale = match claims.get_opt(&claim.name).await {
                    Ok(None) => true,
                    Ok(Some(found)) => {
                        found.metadata.uid.as_deref() != Some(claim.uid.as_str())
                            || !crate::claims::allocated_from(&found, self.view.node())
                    }
                    Err(error) => {
                        tracing::debug!(%error, "reading a mirrored claim; trying again later");
                        false
                    }
                };
                if !stale {
                    continue;
                }
                let gone = Claim {
                    namespace,
                    uid: claim.uid,
                    name: claim.name,
                };
                tracing::info!(namespace = %gone.namespace, claim = %gone.name, "the claim is gone or no longer allocated here; releasing its mirror");
                let why = "the claim is gone or no longer allocated on this node";
                if let Err(error) = self.unprepare(&gone, why).await {
                    tracing::warn!(%error, "releasing a stale mirror failed; retrying later");
                }
            }
        }
    }
}

/// The `prepare` span of a claim: the root of its pod's trace (kube-scheduler
/// allocated the claim itself; Tessera first sees the pod here), with the
/// claim and the first pod it is reserved for. Its context is stored on the
/// claim's mirror allocation, as Bind's is on a device-plugin pod's.
fn prepare_span(node: &str, claim: &ResourceClaim) -> tracing::Span {
    let pod = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .and_then(|r| r.iter().find(|c| c.resource == "pods"));
    tracing::info_span!(
        "prepare",
        k8s.node.name = node,
        k8s.namespace.name = claim.metadata.namespace.as_deref().unwrap_or_default(),
        k8s.pod.name = pod.map(|p| p.name.as_str()).unwrap_or_default(),
        k8s.pod.uid = pod.map(|p| p.uid.as_str()).unwrap_or_default(),
        k8s.resourceclaim.name = claim.metadata.name.as_deref().unwrap_or_default(),
        k8s.resourceclaim.uid = claim.metadata.uid.as_deref().unwrap_or_default(),
    )
}

/// Permissions of a CDI spec: containerd reads it, only root writes it.
const CDI_MODE: u32 = 0o644;

/// How often the node's live mirrors are checked against their claims.
const RECONCILE: std::time::Duration = std::time::Duration::from_secs(30);

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let answer = self.prepare(&claim).await.unwrap_or_else(|error| {
                tracing::warn!(namespace = %claim.namespace, claim = %claim.name, %error, "preparing a claim failed");
                NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error: error.to_string(),
                }
            });
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let error = match self
                .unprepare(&claim, "the kubelet unprepared the claim")
                .await
            {
                Ok(()) => String::new(),
                Err(error) => {
                    tracing::warn!(namespace = %claim.namespace, claim = %claim.name, %error, "unpreparing a claim failed");
                    error.to_string()
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}
