//! The holders of static MIG instances, recorded in the ledger.
//!
//! With `migStrategy: mixed` the default scheduler places pods on the Node's
//! `nvidia.com/mig-<profile>` counts and the kubelet picks the instance, so
//! no Bind ever books one. The kubelet's pod-resources API says which pod's
//! container got which device ID (the MIG UUID); every [`PASS`] the agent
//! lists it and records each pod holding static instances as a
//! VgpuAllocation named after the pod, owned by it (the garbage collector
//! removes it with the pod), Allocated, with one MIG slice per instance. The
//! lifecycle controller releases it when the pod ends, as any allocation; the
//! GpuNode's `migInstances[].heldBy` names it, and `kubectl get
//! vgpuallocations` lists it.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{Api, Resource, ResourceExt};
use tessera_api::v1alpha1::{
    AllocationTotals, ContainerAllocation, DeviceSlice, GpuDevice, MigInstance, MigSlice,
    ServedMigInstance, VgpuAllocation, VgpuAllocationSpec,
};
use tessera_deviceplugin::podresources::v1::{
    ListPodResourcesRequest, PodResources, pod_resources_lister_client::PodResourcesListerClient,
};
use tokio::sync::watch;

use crate::{Error, offer::Offer, plugin::static_mig::static_gpus, view::NodeView};

/// How often the pod-resources API is listed while the node serves static
/// MIG instances.
pub const PASS: Duration = Duration::from_secs(5);
/// How long one `List` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// One pod's static instances, as the ledger records them.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name (and the allocation's).
    pub pod: String,
    /// Per container, one MIG slice per instance it holds.
    pub containers: Vec<ContainerAllocation>,
    /// Which container got which instance.
    pub served: Vec<ServedMigInstance>,
}

/// The holds in `pods` (the kubelet's `List`) of the static instances
/// `offer` serves. Device IDs that are no static instance of this node's
/// (another plugin's devices, an instance that went meanwhile) are skipped.
pub fn holds(offer: &Offer, pods: &[PodResources]) -> Vec<Hold> {
    let instances: HashMap<&str, (&GpuDevice, &MigInstance)> = static_gpus(offer)
        .flat_map(|gpu| {
            gpu.mig_instances
                .iter()
                .map(move |i| (i.uuid.as_str(), (gpu, i)))
        })
        .collect();
    let mut holds = Vec::new();
    for pod in pods {
        let mut containers = Vec::new();
        let mut served = Vec::new();
        for container in &pod.containers {
            let devices: Vec<DeviceSlice> = container
                .devices
                .iter()
                .flat_map(|d| &d.device_ids)
                .filter_map(|id| instances.get(id.as_str()))
                .map(|(gpu, instance)| {
                    served.push(ServedMigInstance {
                        container: container.name.clone(),
                        gpu: gpu.uuid.clone(),
                        uuid: instance.uuid.clone(),
                    });
                    slice(gpu, instance)
                })
                .collect();
            if !devices.is_empty() {
                containers.push(ContainerAllocation {
                    name: container.name.clone(),
                    devices,
                    priority: None,
                });
            }
        }
        if !containers.is_empty() {
            holds.push(Hold {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                containers,
                served,
            });
        }
    }
    holds
}

/// The slice of `gpu` that `instance` is: its memory, its share of the
/// GPU's compute slices (from the GPU's layout, else Tessera's table for
/// the model; all of them when neither knows the profile), and where it
/// sits.
fn slice(gpu: &GpuDevice, instance: &MigInstance) -> DeviceSlice {
    let cores = gpu
        .mig
        .clone()
        .or_else(|| tessera_api::mig::layout_for_model(&gpu.model))
        .and_then(|layout| {
            let profile = layout
                .profiles
                .iter()
                .find(|p| p.name == instance.profile)?;
            let total = layout.compute_slices.max(1);
            u32::try_from(u64::from(profile.compute_slices) * 100 / u64::from(total)).ok()
        })
        .unwrap_or(100);
    DeviceSlice {
        mutex: false,
        core_indexes: Vec::new(),
        family: gpu.family,
        template: None,
        uuid: gpu.uuid.clone(),
        index: gpu.index,
        model: gpu.model.clone(),
        memory_mib: instance.memory_mib,
        cores,
        mig: Some(MigSlice {
            profile: instance.profile.clone(),
            placement: instance.placement,
        }),
        sharing: None,
    }
}

/// The ledger's record of `hold`, for the pod with UID `pod_uid` on `node`:
/// named after the pod and owned by it.
pub fn record_of(hold: &Hold, pod_uid: &str, node: &str) -> VgpuAllocation {
    VgpuAllocation {
        metadata: ObjectMeta {
            name: Some(hold.pod.clone()),
            namespace: Some(hold.namespace.clone()),
            owner_references: Some(vec![OwnerReference {
                api_version: Pod::api_version(&()).into_owned(),
                kind: Pod::kind(&()).into_owned(),
                name: hold.pod.clone(),
                uid: pod_uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: VgpuAllocationSpec {
            quota: Default::default(),
            pod_name: hold.pod.clone(),
            pod_uid: pod_uid.to_owned(),
            node_name: node.to_owned(),
            totals: AllocationTotals::of(&hold.containers),
            containers: hold.containers.clone(),
            gpu_policy: None,
            node_policy: None,
            claim: None,
            trace_context: None,
            priority: None,
            nomination: None,
        },
        status: None,
    }
}

/// The holds not yet in the ledger: those whose pod has no allocation of
/// its name with these containers (in any phase: a finished pod the kubelet
/// still lists keeps its released record). `ledger` is every allocation of
/// the node, of any device family: a pod's name held by an allocation the
/// scheduler wrote (a vendor slice beside the static instance, on a mixed
/// node) is never recorded over ([`scheduler_held`]).
pub fn unrecorded(holds: Vec<Hold>, ledger: &[VgpuAllocation]) -> Vec<Hold> {
    let recorded = by_name(ledger);
    holds
        .into_iter()
        .filter(
            |h| match recorded.get(&(h.namespace.clone(), h.pod.clone())) {
                Some(found) => {
                    found.spec.containers != h.containers && crate::ledger::agent_written(found)
                }
                None => true,
            },
        )
        .collect()
}

/// The holds whose pod's name is held by an allocation the scheduler wrote
/// (see [`crate::ledger::agent_written`]): not recorded, since the ledger
/// must not lose that allocation's slices and quota charge.
pub fn scheduler_held<'a>(holds: &'a [Hold], ledger: &[VgpuAllocation]) -> Vec<&'a Hold> {
    let recorded = by_name(ledger);
    holds
        .iter()
        .filter(|h| {
            recorded
                .get(&(h.namespace.clone(), h.pod.clone()))
                .is_some_and(|found| !crate::ledger::agent_written(found))
        })
        .collect()
}

/// The allocations by `(namespace, name)`.
fn by_name(ledger: &[VgpuAllocation]) -> BTreeMap<(String, String), &VgpuAllocation> {
    ledger
        .iter()
        .map(|a| ((a.namespace().unwrap_or_default(), a.name_any()), a))
        .collect()
}

/// Records the holders of the node's static instances every [`PASS`] while
/// it serves any, listing the kubelet's pod-resources API at `socket`.
pub async fn keep(view: NodeView, offers: watch::Receiver<Offer>, socket: PathBuf) {
    let mut ticks = tokio::time::interval(PASS);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = None;
    let mut warned = std::collections::BTreeSet::new();
    loop {
        ticks.tick().await;
        let offer = offers.borrow().clone();
        if static_gpus(&offer).all(|gpu| gpu.mig_instances.is_empty()) {
            continue;
        }
        let error = pass(&view, &offer, &socket, &mut warned)
            .await
            .err()
            .map(|e| e.to_string());
        if error.is_some() && error != last_error {
            tracing::warn!(error = error.as_deref().unwrap_or_default(), socket = %socket.display(), "recording the holders of static MIG instances");
        }
        last_error = error;
    }
}

/// One pass: list, and record every hold not yet recorded; warn once per
/// pod (`warned`) whose name the scheduler's allocation holds.
async fn pass(
    view: &NodeView,
    offer: &Offer,
    socket: &std::path::Path,
    warned: &mut std::collections::BTreeSet<(String, String)>,
) -> Result<(), Error> {
    let listed = list(socket).await?;
    let ledger = view.node_allocations();
    let found = holds(offer, &listed);
    for hold in scheduler_held(&found, &ledger) {
        if warned.insert((hold.namespace.clone(), hold.pod.clone())) {
            tracing::warn!(namespace = %hold.namespace, pod = %hold.pod, instances = hold.served.len(), "the pod holds static MIG instances and an allocation the scheduler wrote: that allocation is kept, and the instances are not recorded in the ledger");
        }
    }
    warned.retain(|(namespace, pod)| {
        found
            .iter()
            .any(|h| &h.namespace == namespace && &h.pod == pod)
    });
    for hold in unrecorded(found, &ledger) {
        let pods = Api::<Pod>::namespaced(view.client().clone(), &hold.namespace);
        let pod = pods.get_opt(&hold.pod).await.map_err(Error::kube(format!(
            "reading pod {}/{}",
            hold.namespace, hold.pod
        )))?;
        let Some(uid) = pod.and_then(|p| p.metadata.uid) else {
            continue; // gone meanwhile: the kubelet will drop it too
        };
        let record = record_of(&hold, &uid, view.node());
        let recorded = crate::ledger::record(
            view.client(),
            record,
            "the kubelet allocated the pod's static MIG instances",
            hold.served.clone(),
        )
        .await?;
        if recorded == crate::ledger::Recorded::Kept {
            continue; // warned by the ledger
        }
        tracing::info!(namespace = %hold.namespace, pod = %hold.pod, instances = hold.served.len(), "recorded the holder of static MIG instances");
    }
    Ok(())
}

/// The kubelet's `List` over its pod-resources socket.
async fn list(socket: &std::path::Path) -> Result<Vec<PodResources>, Error> {
    let failed = |what: String| Error::PodResources(format!("{}: {what}", socket.display()));
    let call = async {
        let channel = tessera_deviceplugin::connect_unix(socket)
            .await
            .map_err(|e| failed(format!("connecting: {e}")))?;
        PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map(|r| r.into_inner().pod_resources)
            .map_err(|s| failed(format!("List: {}", s.message())))
    };
    tokio::time::timeout(LIST_TIMEOUT, call)
        .await
        .map_err(|_| failed(format!("no answer to List in {} s", LIST_TIMEOUT.as_secs())))?
}

#[cfg(test)]
mod tests;
