//! Bind: lock the node, ask its agent, record the allocation, confirm the
//! fit once this replica's watch has delivered it, bind the pod. Any
//! failure undoes what was done.
//!
//! API requests per GPU pod: the NodeLock's in-place update (its create
//! for a node's first GPU pod), the VgpuAllocation's create (which reads
//! `Bound` by the CRD's default status), the binding: three.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions, VersionMatch},
};
use serde_json::json;
use tessera_api::v1alpha1::{
    NodeLock, PodReference, TraceContext, VgpuAllocation, VgpuAllocationSpec,
};
use tessera_scheduling::request::{Binding, NodeDevice, container_order, parse_pod};

use super::{filter::NOT_READY, lock, wire::ExtenderBindingArgs};
use crate::{
    Error,
    config::Config,
    engine::{GpuDevice, NodeGpus, Placement, quota},
    projection::{self, AllocationKey, Projection},
};

/// What a successful Bind did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bound {
    /// Per container, the UUIDs it got (empty for pods without GPU requests).
    pub devices: Vec<(String, Vec<String>)>,
}

/// Binds pods for kube-scheduler.
#[derive(Clone)]
pub struct Binder {
    client: Client,
    projection: Projection,
    locker: lock::Locker,
    seen: std::sync::Arc<super::seen::SeenPods>,
    config: std::sync::Arc<Config>,
    metrics: super::metrics::ExtenderMetrics,
    /// Whether the API server serves `spec.nodeName` as a field selector on
    /// VgpuAllocations (Kubernetes 1.31 and later); cleared at its first
    /// refusal, after which the recheck lists them all and keeps the node's.
    by_field: std::sync::Arc<AtomicBool>,
    /// Whether the API server's cache serves a list "not older than" a
    /// version it has not seen an event of that kind at (Kubernetes 1.31
    /// and later): learned from its version at the first Bind.
    cache_serves_versions: std::sync::Arc<tokio::sync::OnceCell<bool>>,
}

impl Binder {
    /// A binder writing through `client`.
    pub fn new(
        client: Client,
        projection: Projection,
        config: std::sync::Arc<Config>,
        metrics: super::metrics::ExtenderMetrics,
    ) -> Self {
        let locker = lock::Locker::new(client.clone(), &projection);
        Self {
            client,
            projection,
            locker,
            seen: std::sync::Arc::default(),
            config,
            metrics,
            by_field: std::sync::Arc::new(AtomicBool::new(true)),
            cache_serves_versions: std::sync::Arc::default(),
        }
    }

    /// The VgpuAllocations on `node`, not older than `version` when given:
    /// by field selector, or, where the API server serves none on custom
    /// resources (before 1.31), from a list of all of them.
    async fn allocations_on(
        &self,
        node: &str,
        version: Option<&str>,
    ) -> Result<kube::core::ObjectList<VgpuAllocation>, kube::Error> {
        if self.by_field.load(Ordering::Relaxed) {
            let selector = format!("spec.nodeName={node}");
            match self.list_allocations(Some(&selector), version).await {
                Err(error) if tessera_kubekit::selectors::unsupported_field_selector(&error) => {
                    tracing::warn!(%error, "no field selectors on VgpuAllocations (Kubernetes before 1.31): Bind lists them all");
                    self.by_field.store(false, Ordering::Relaxed);
                }
                listed => return listed,
            }
        }
        let mut listed = self.list_allocations(None, version).await?;
        listed.items.retain(|a| a.spec.node_name == node);
        Ok(listed)
    }

    /// VgpuAllocations matching `selector`, not older than `version`: from
    /// the API server's cache where it can say so. Before 1.31 a custom
    /// resource's watch cache learns of newer versions only from its own
    /// events, so a version taken from a NodeLock may be one it never
    /// reaches: it answers 504 after 3 s, which the client retries for a
    /// minute, past Bind's deadline. There the list is a consistent read
    /// from etcd, as new as the version or newer.
    async fn list_allocations(
        &self,
        selector: Option<&str>,
        version: Option<&str>,
    ) -> Result<kube::core::ObjectList<VgpuAllocation>, kube::Error> {
        let all: Api<VgpuAllocation> = Api::all(self.client.clone());
        let mut params = ListParams::default();
        if let Some(selector) = selector {
            params = params.fields(selector);
        }
        let cache_serves = *self
            .cache_serves_versions
            .get_or_init(|| async {
                let version = self.client.apiserver_version().await;
                let serves = version.as_ref().map_or(true, |v| {
                    serves_versions_from_cache(&v.major, &v.minor)
                });
                if !serves {
                    tracing::info!(
                        version = version.map(|v| v.git_version).unwrap_or_default(),
                        "Bind reads a node's allocations from etcd: this API server's cache cannot serve them as of a newer version (before Kubernetes 1.31)"
                    );
                }
                serves
            })
            .await;
        if let Some(version) = version
            && cache_serves
        {
            params = params.at(version).matching(VersionMatch::NotOlderThan);
        }
        all.list(&params).await
    }

    /// The pods Filter answered for lately, which Bind takes instead of
    /// reading them (see `seen.rs`).
    pub fn seen(&self) -> &super::seen::SeenPods {
        &self.seen
    }

    /// Whether a Bind is in `node`'s bind-to-Allocate window: its NodeLock
    /// is held (by any replica), or a Bind of this replica is queued for it.
    pub fn bind_pending(&self, node: &str) -> bool {
        self.locker.queued(node) || self.projection.lock_held(node)
    }

    /// Binds the pod to the node, recording its GPU slices first.
    pub async fn bind(
        &self,
        args: &ExtenderBindingArgs,
        trace: Option<TraceContext>,
    ) -> Result<Bound, Error> {
        let _pending = self.locker.pending(&args.node);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        let pod = match self.seen.take(&args.pod_uid) {
            Some(pod) => pod,
            None => pods
                .get(&args.pod_name)
                .await
                .map_err(Error::kube("reading the pod to bind"))?,
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if uid != args.pod_uid {
            return Err(Error::Stale(format!(
                "pod {}/{} was replaced (uid {uid}, scheduler asked for {})",
                args.pod_namespace, args.pod_name, args.pod_uid
            )));
        }
        let Some(mut request) = parse_pod(&pod, &self.config.request)? else {
            post_binding(&pods, args).await?;
            return Ok(Bound::default());
        };

        // Decide and reserve in memory, so the next Filter already sees it.
        let key = AllocationKey {
            namespace: args.pod_namespace.clone(),
            name: args.pod_name.clone(),
        };
        let policy = self.config.gpu_policy_of(&mut request.options);
        let limits = self
            .projection
            .quota_limits(&args.pod_namespace, &self.config.request);
        let names = quota::names(&request, &self.config.request);
        let priority = pod.spec.as_ref().and_then(|s| s.priority);
        let (placement, devices, charged) =
            self.projection
                .assume(&key, &uid, &args.node, |node, namespace_used| {
                    super::placed::place(
                        node,
                        &args.node,
                        &request,
                        policy,
                        (&names, &limits, namespace_used),
                        &uid,
                        priority,
                    )
                })?;

        let spec = super::placed::allocation_spec(
            (&args.pod_name, &uid, &args.node),
            &devices,
            &placement,
            &request,
            policy,
            &self.config,
            trace,
            charged,
            priority,
        );
        match self
            .commit(args, &pod, &pods, spec, &devices, &placement)
            .await
        {
            Ok(()) => Ok(Bound {
                devices: placement
                    .containers
                    .iter()
                    .map(|c| {
                        (
                            c.name.clone(),
                            c.slices
                                .iter()
                                .map(|s| devices[s.device].uuid.clone())
                                .collect(),
                        )
                    })
                    .collect(),
            }),
            Err(error) => {
                // Pods turned away because of this reservation may fit now.
                self.projection.forget(&key, &uid, &args.node);
                // The reservation replaced whatever the ledger held for this
                // pod; what the API server still has of it comes back.
                self.restore_own(&args.pod_namespace, &args.pod_name, &uid)
                    .await;
                self.metrics.rolled_back(error.metric_label());
                Err(error)
            }
        }
    }

    /// After a failed Bind: its reservation replaced whatever the ledger held
    /// for this pod, and forgetting it removed that too. If the API server
    /// still has an allocation of this pod (its preemption's hold, one an
    /// earlier Bind of it left behind, or this Bind's own whose rollback
    /// could not delete it), the ledger gets it back.
    /// Without this the slices of such a leftover were free in the ledger
    /// while its object still held them, and the next pods were placed on
    /// them (seen in the chaos test: 120 % of a GPU's cores).
    async fn restore_own(&self, namespace: &str, name: &str, uid: &str) {
        let allocations: Api<VgpuAllocation> = Api::namespaced(self.client.clone(), namespace);
        match allocations.get_opt(name).await {
            Ok(Some(own)) if own.spec.pod_uid == uid => self.projection.restore(&own),
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, pod = %name, "could not read the pod's allocation back after a failed Bind");
            }
        }
    }

    async fn commit(
        &self,
        args: &ExtenderBindingArgs,
        pod: &Pod,
        pods: &Api<Pod>,
        spec: VgpuAllocationSpec,
        devices: &[GpuDevice],
        placement: &Placement,
    ) -> Result<(), Error> {
        let holder = PodReference {
            namespace: args.pod_namespace.clone(),
            name: args.pod_name.clone(),
            uid: args.pod_uid.clone(),
        };
        // Bounded wait: first for this node's earlier Binds in this process,
        // then for the pod holding the node's lock.
        let waiting = Instant::now();
        let deadline = waiting + self.config.node_lock_wait();
        let _turn = self.locker.turn(&args.node, deadline).await?;
        let held = self
            .locker
            .acquire(
                &args.node,
                &holder,
                &args.pod_name,
                self.config.node_lock_ttl_seconds,
                deadline,
            )
            .await?;
        self.metrics
            .lock_wait_seconds
            .observe(waiting.elapsed().as_secs_f64());
        let allocations: Api<VgpuAllocation> =
            Api::namespaced(self.client.clone(), &args.pod_namespace);
        // What another vendor's device plugin reads at Allocate; empty for
        // a pod of NVIDIA GPUs only.
        let order = container_order(pod);
        let node_devices: Vec<NodeDevice<'_>> = devices
            .iter()
            .map(|d| NodeDevice {
                uuid: &d.uuid,
                cores: d.cores,
                minor: d.minor.as_deref(),
                profiles: d
                    .profiles
                    .iter()
                    .map(|p| (p.name.as_str(), p.id.as_str()))
                    .collect(),
            })
            .collect();
        let handoff = self.config.request.families().hand_off(&Binding {
            spec: &spec,
            containers: &order,
            devices: &node_devices,
            namespace: &args.pod_namespace,
            pod: &args.pod_name,
            now: k8s_openapi::jiff::Timestamp::now(),
        });
        let result = async {
            if !handoff.unclaimed.is_empty() {
                return Err(Error::NoLongerFits {
                    node: args.node.clone(),
                    reason: format!(
                        "devices {} are of a family the configuration no longer enables",
                        handoff.unclaimed.join(", ")
                    ),
                });
            }
            self.agent_ready(args).await?;
            let created = create_allocation(&allocations, pod, spec, &args.node).await?;
            let confirmed = self
                .confirm(
                    args,
                    devices,
                    placement,
                    created.resource_version.as_deref(),
                    held.resource_version.as_deref(),
                )
                .await;
            if let Err(error) = confirmed {
                delete_created(&allocations, &args.pod_name, &created).await;
                return Err(error);
            }
            let bound = async {
                if !handoff.is_empty() {
                    super::handoff::hand_off(&self.client, pods, args, &handoff).await?;
                }
                bind_for_certain(pods, args).await
            };
            match bound.await {
                Ok(()) => Ok(()),
                // Never guessed: the pod may be bound, so what it holds stays.
                Err(error @ Error::BindingUnknown { .. }) => Err(error),
                Err(error) => {
                    if !handoff.is_empty() {
                        super::handoff::take_back(&self.client, pods, args, &handoff).await;
                    }
                    delete_created(&allocations, &args.pod_name, &created).await;
                    Err(error)
                }
            }
        }
        .await;
        // The pod is bound. Its allocation reads `Bound` without a status
        // write: the CRD defaults `status` to `{phase: Bound}` (api/src/crds.rs).
        match result {
            Ok(()) => Ok(()),
            Err(error @ Error::BindingUnknown { .. }) => {
                tracing::warn!(%error, pod = %args.pod_name, node = %args.node, "keeping the NodeLock and allocation of a pod that may be bound");
                Err(error)
            }
            Err(error) => {
                self.locker.release(&held).await;
                Err(error)
            }
        }
    }

    /// Whether the node's agent can serve the pod, asked after taking the
    /// node's lock. A stopping agent takes the node's lock itself once no
    /// pod holds it (`NodeLockSpec::draining`), so a Bind that got the lock
    /// has a pod the agent waits for; this catches an agent that died
    /// without stopping: its pod, as watched, and the agent itself, asked
    /// directly (`probe`) where its pod is known.
    async fn agent_ready(&self, args: &ExtenderBindingArgs) -> Result<(), Error> {
        let not_ready = |reason: String| Error::NoLongerFits {
            node: args.node.clone(),
            reason: format!("{NOT_READY}{reason}"),
        };
        // The agent's pod may have died since Filter (the GpuNode still says
        // what the dead agent wrote): the watch of agent pods knows.
        let agent_down = self
            .projection
            .read()
            .not_ready(&args.node)
            .map(str::to_owned);
        if let Some(reason) = agent_down {
            return Err(not_ready(reason));
        }
        match self.projection.agent_endpoint(&args.node) {
            // And the agent itself, now: its kubelet may not have reported
            // its death yet (see `probe`).
            Some(endpoint) => super::probe::agent_ready(&endpoint)
                .await
                .map_err(not_ready),
            None => Ok(()),
        }
    }

    /// Confirms, with the pod's allocation written, that the node still
    /// holds every allocation on it: once this replica's watch has delivered
    /// the allocation just created (resourceVersion `created`), it has
    /// delivered every allocation written before it, and every allocation
    /// of this node was written under its lock, before the previous holder
    /// released it and so before `created`. So the ledger is then as new as
    /// the API server for this node, and its fold of the node decides. Only
    /// when the watch has not caught up within [`CATCH_UP`] (an overloaded
    /// API server) is the API server asked ([`Self::recheck_listed`]).
    async fn confirm(
        &self,
        args: &ExtenderBindingArgs,
        devices: &[GpuDevice],
        placement: &Placement,
        created: Option<&str>,
        lock_version: Option<&str>,
    ) -> Result<(), Error> {
        let created = created.and_then(|v| v.parse().ok()).unwrap_or(0);
        if !self
            .projection
            .caught_up(created, Instant::now() + CATCH_UP)
            .await
        {
            self.metrics.recheck_listed();
            return self
                .recheck_listed(args, devices, placement, lock_version)
                .await;
        }
        let fits = self
            .projection
            .read()
            .node(&args.node)
            .is_some_and(NodeGpus::within_capacity);
        if fits {
            Ok(())
        } else {
            Err(Error::NoLongerFits {
                node: args.node.clone(),
                reason: "the API server holds allocations that leave no room for it".into(),
            })
        }
    }

    /// Re-checks the placement against the allocations the API server holds
    /// for the node: the node's lock is held, so this view cannot change
    /// under us except by releases. The pod's own allocation is left out
    /// (it is `placement`).
    ///
    /// The list is served from the API server's watch cache once that cache
    /// has seen `lock_version` (the lock's resourceVersion as created):
    /// every allocation of this node was created under its lock, before the
    /// previous holder released it and so before this lock existed, hence
    /// is in that snapshot. A plain (quorum) list read every allocation of
    /// the cluster from etcd for each Bind: at 1,000 nodes etcd spent 48 CPU
    /// seconds in a 1,000-pod burst and a third of those lists timed out.
    async fn recheck_listed(
        &self,
        args: &ExtenderBindingArgs,
        devices: &[GpuDevice],
        placement: &Placement,
        lock_version: Option<&str>,
    ) -> Result<(), Error> {
        let on_node = self
            .allocations_on(&args.node, lock_version)
            .await
            .map_err(Error::kube("listing the node's allocations"))?;
        let mut fold = NodeGpus::new(devices.to_vec());
        for allocation in &on_node.items {
            let ours = allocation.namespace().as_deref() == Some(args.pod_namespace.as_str())
                && allocation.name_any() == args.pod_name;
            if ours {
                continue;
            }
            if let Some(live) = projection::live(allocation) {
                projection::charge_allocation(&mut fold, &live);
            }
        }
        for slice in placement.slices() {
            fold.charge(slice);
        }
        if fold.within_capacity() {
            Ok(())
        } else {
            Err(Error::NoLongerFits {
                node: args.node.clone(),
                reason: "the API server holds allocations that leave no room for it".into(),
            })
        }
    }
}

/// How long Bind waits for its own watch to deliver the allocation it
/// created before it asks the API server instead (see [`Binder::confirm`]).
const CATCH_UP: Duration = Duration::from_secs(3);

/// The allocation a Bind created (or found as its own): what its rollback
/// may delete.
struct Created {
    uid: Option<String>,
    resource_version: Option<String>,
}

impl Created {
    fn of(allocation: &VgpuAllocation) -> Self {
        Self {
            uid: allocation.metadata.uid.clone(),
            resource_version: allocation.metadata.resource_version.clone(),
        }
    }
}

/// Deletes the allocation this Bind created, and only it: an allocation of
/// the same name written since (a later pod's) has another UID.
async fn delete_created(api: &Api<VgpuAllocation>, name: &str, created: &Created) {
    let params = DeleteParams::default().preconditions(Preconditions {
        uid: created.uid.clone(),
        resource_version: None,
    });
    if let Err(error) = api.delete(name, &params).await {
        tracing::debug!(%error, allocation = name, "the allocation of a failed Bind is gone or replaced");
    }
}

/// Creates the allocation (replacing one left by an earlier pod of the same
/// name, or by an earlier Bind of this pod to `node`, whose lock this Bind
/// now holds) and returns what it created.
async fn create_allocation(
    api: &Api<VgpuAllocation>,
    pod: &Pod,
    spec: VgpuAllocationSpec,
    node: &str,
) -> Result<Created, Error> {
    let name = spec.pod_name.clone();
    let owner = super::placed::owned_by_pod(&name, &spec.pod_uid);
    let mut allocation = VgpuAllocation::new(&name, spec);
    allocation.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: pod.namespace(),
        owner_references: Some(vec![owner]),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &allocation).await {
        Ok(created) => return Ok(Created::of(&created)),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(e) => return Err(Error::kube("creating the VgpuAllocation")(e)),
    }
    let existing = api
        .get(&name)
        .await
        .map_err(Error::kube("reading the existing VgpuAllocation"))?;
    if existing.spec == allocation.spec {
        return Ok(Created::of(&existing)); // our own earlier attempt
    }
    // A DRA claim's mirror holds a prepared claim's slices, and a pod may be
    // named as one (`claim-<claim UID>`): never replaced by a pod's
    // allocation (review 2026-12-01, L3).
    if let Some(claim) = &existing.spec.claim {
        return Err(Error::Stale(format!(
            "pod {name} is named as the VgpuAllocation of DRA claim {} on node {}; rename the pod",
            claim.name, existing.spec.node_name
        )));
    }
    // Slices held for this pod by its preemption are replaced by its own.
    if existing.spec.pod_uid == allocation.spec.pod_uid
        && existing.spec.nomination.is_none()
        && !left_by_failed_bind(api, pod, &existing, node).await?
    {
        return Err(Error::Stale(format!(
            "pod {name} already has an allocation on node {}; retrying",
            existing.spec.node_name
        )));
    }
    // Left by an earlier pod of the same name that garbage collection has
    // not removed yet, by a failed Bind of this pod (see below), or held
    // for this pod.
    let params = DeleteParams::default().preconditions(Preconditions {
        uid: existing.meta().uid.clone(),
        resource_version: existing.metadata.resource_version.clone(),
    });
    let _ = api.delete(&name, &params).await;
    api.create(&PostParams::default(), &allocation)
        .await
        .map(|created| Created::of(&created))
        .map_err(Error::kube("creating the VgpuAllocation"))
}

/// Whether `existing`, an allocation of this very pod, was left by an
/// earlier Bind of it that failed and could not delete it (its rollback
/// timed out on a loaded API server). Until then such a pod was stuck for
/// good: every retry found the allocation and gave up (seen at 5,000 nodes).
/// It is a leftover when the pod is still unbound (read fresh: a pod that
/// is bound keeps its allocation) and no other Bind of it holds the
/// allocation's node (a slow Bind of it may still be under way there). On
/// `node`, the node this Bind holds the lock of, it is this pod's own from
/// an earlier attempt whose binding had no known outcome (kept, never
/// guessed: [`Error::BindingUnknown`]).
async fn left_by_failed_bind(
    api: &Api<VgpuAllocation>,
    pod: &Pod,
    existing: &VgpuAllocation,
    node: &str,
) -> Result<bool, Error> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let fresh = Api::<Pod>::namespaced(api.clone().into_client(), &namespace)
        .get_opt(&name)
        .await
        .map_err(Error::kube("reading the pod to bind"))?;
    let unbound = fresh.is_some_and(|p| {
        p.metadata.uid == pod.metadata.uid && p.spec.is_none_or(|s| s.node_name.is_none())
    });
    if !unbound {
        return Ok(false);
    }
    if existing.spec.node_name == node {
        tracing::warn!(pod = %name, node, "replacing the allocation an earlier Bind of this pod left on this node");
        return Ok(true);
    }
    let lock = Api::<NodeLock>::all(api.clone().into_client())
        .get_opt(&existing.spec.node_name)
        .await
        .map_err(Error::kube("reading the NodeLock"))?;
    let held_for_it = lock.is_some_and(|l| l.spec.holder.uid == existing.spec.pod_uid);
    if !held_for_it {
        tracing::warn!(
            pod = %name,
            node = %existing.spec.node_name,
            "removing the allocation a failed Bind of this pod left behind"
        );
    }
    Ok(!held_for_it)
}

/// How many times Bind posts a binding whose outcome stays unknown.
const BINDING_ATTEMPTS: u32 = 3;

/// Binds the pod, and knows it did or did not (review 2026-12-01, H6): an
/// error from the binding POST may come after the API server committed it
/// (a 504 "request did not complete within the allotted timeout", a client
/// timeout, a dropped connection). Then the pod is read back: bound to the
/// node means bound; unbound after a definite refusal means not bound;
/// otherwise the binding is posted again (a repeat of a committed binding
/// is refused with a conflict, and the read-back then finds the pod bound).
/// When no attempt tells, [`Error::BindingUnknown`].
async fn bind_for_certain(pods: &Api<Pod>, args: &ExtenderBindingArgs) -> Result<(), Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Err(error) = post_binding(pods, args).await else {
            return Ok(());
        };
        let Error::Kube { source, .. } = error else {
            return Err(error);
        };
        let definite = definite_refusal(&source);
        match pods.get_opt(&args.pod_name).await {
            Ok(read) => match binding_seen(read.as_ref(), args) {
                Seen::Bound => {
                    tracing::info!(pod = %args.pod_name, node = %args.node, error = %source, "the binding reported an error, but the pod is bound");
                    return Ok(());
                }
                Seen::Elsewhere(why) => return Err(Error::Stale(why)),
                Seen::Unbound if definite => {
                    return Err(Error::kube("binding the pod")(source));
                }
                Seen::Unbound => {}
            },
            Err(read_error) => {
                tracing::warn!(pod = %args.pod_name, error = %read_error, "could not read back a pod whose binding failed");
            }
        }
        if attempt >= BINDING_ATTEMPTS {
            return Err(Error::BindingUnknown {
                pod: format!("{}/{}", args.pod_namespace, args.pod_name),
                node: args.node.clone(),
                source,
            });
        }
        tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
    }
}

/// What reading a pod back after a failed binding says.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Bound to the node Bind asked for.
    Bound,
    /// Not bound (yet).
    Unbound,
    /// Gone, replaced, or bound elsewhere: this Bind is over, whatever
    /// its binding did.
    Elsewhere(String),
}

fn binding_seen(pod: Option<&Pod>, args: &ExtenderBindingArgs) -> Seen {
    let name = format!("{}/{}", args.pod_namespace, args.pod_name);
    let Some(pod) = pod.filter(|p| p.metadata.uid.as_deref() == Some(args.pod_uid.as_str())) else {
        return Seen::Elsewhere(format!("pod {name} was deleted or replaced while binding"));
    };
    match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        None => Seen::Unbound,
        Some(node) if node == args.node => Seen::Bound,
        Some(other) => Seen::Elsewhere(format!("pod {name} is bound to node {other}")),
    }
}

/// Whether the API server refused the binding and so did not commit it: a
/// 4xx other than a timeout or throttling. A 5xx (504 after the timeout, 500,
/// 503), a transport error or a client timeout may come after the commit.
fn definite_refusal(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => {
            (400..500).contains(&status.code) && !matches!(status.code, 408 | 429)
        }
        _ => false,
    }
}

async fn post_binding(pods: &Api<Pod>, args: &ExtenderBindingArgs) -> Result<(), Error> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": args.pod_uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
    });
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        &args.pod_name,
        &PostParams::default(),
        &binding,
    )
    .await
    .map(|_| ())
    .map_err(Error::kube("binding the pod"))
}

/// Whether an API server of this version (`major`, `minor` as it reports
/// them, e.g. `1`, `30+`) serves lists "not older than" a version from its
/// cache: 1.31 and later, whose cache asks etcd for progress.
fn serves_versions_from_cache(major: &str, minor: &str) -> bool {
    let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
    match (major.parse::<u32>(), minor.parse::<u32>()) {
        (Ok(1), Ok(minor)) => minor >= 31,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::{Seen, binding_seen, definite_refusal, serves_versions_from_cache};
    use crate::extender::wire::ExtenderBindingArgs;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("m", "r")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn only_a_4xx_refusal_says_a_binding_was_not_made() {
        for code in [400, 403, 404, 409, 422] {
            assert!(definite_refusal(&status(code)), "{code}");
        }
        for code in [408, 429, 500, 503, 504] {
            assert!(!definite_refusal(&status(code)), "{code}");
        }
        assert!(!definite_refusal(
            &kube::Error::LinesCodecMaxLineLengthExceeded
        ));
    }

    #[test]
    fn a_pod_read_back_says_bound_only_on_the_node_with_its_uid() {
        let args = ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "d".into(),
            pod_uid: "u1".into(),
            node: "n1".into(),
        };
        let pod = |uid: &str, node: Option<&str>| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "d", "uid": uid},
                "spec": {"nodeName": node, "containers": []}}))
            .unwrap()
        };
        assert_eq!(
            binding_seen(Some(&pod("u1", Some("n1"))), &args),
            Seen::Bound
        );
        assert_eq!(binding_seen(Some(&pod("u1", None)), &args), Seen::Unbound);
        assert!(matches!(
            binding_seen(Some(&pod("u1", Some("n2"))), &args),
            Seen::Elsewhere(_)
        ));
        assert!(matches!(
            binding_seen(Some(&pod("u2", Some("n1"))), &args),
            Seen::Elsewhere(_)
        ));
        assert!(matches!(binding_seen(None, &args), Seen::Elsewhere(_)));
    }

    #[test]
    fn only_1_31_and_later_serve_lists_as_of_a_version_from_cache() {
        assert!(!serves_versions_from_cache("1", "30"));
        assert!(!serves_versions_from_cache("1", "30+"));
        assert!(serves_versions_from_cache("1", "31"));
        assert!(serves_versions_from_cache("1", "36"));
        // What it cannot read is taken as current.
        assert!(serves_versions_from_cache("1", ""));
        assert!(serves_versions_from_cache("2", "0"));
    }
}
