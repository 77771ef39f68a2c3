//! Which container the kubelet's Allocate is for, decided from the node's
//! NodeLock and the holder's VgpuAllocation alone, and the device plugin's
//! serialisation of what the container gets ([`answer`]). Pure: no I/O.
//!
//! The kubelet's Allocate carries device IDs but no pod. The scheduler
//! extender binds at most one GPU pod per node between its NodeLock and
//! this call, so the lock names the pod; its allocation names the devices
//! and limits of each container, and the kubelet asks for the containers in
//! pod spec order (init containers first), which is the allocation's order.

use std::path::PathBuf;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_api::v1alpha1::{
    AllocationPhase, DeviceSlice, NodeLock, NodeSettings, ServedMigInstance, VgpuAllocation,
    VgpuAllocationStatus,
};
use tessera_deviceplugin::v1beta1::{CdiDevice, ContainerAllocateResponse, Mount};

use super::{device_list::DeviceList, ids::uuid_of};
pub use crate::error::AllocateError;
use crate::{
    contract::{Contract, HostPaths},
    sharing::Container,
};

/// The container to serve, and what to record once it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// Namespace of the pod served.
    pub namespace: String,
    /// The allocation (= pod) name.
    pub allocation: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// The container served.
    pub container: String,
    /// Its slices (the allocation's GPUs), in its CUDA order.
    pub slices: Vec<DeviceSlice>,
    /// Its priority (HAMi's `nvidia.com/priority`).
    pub priority: Option<u32>,
    /// The container's region directory on the host.
    pub region_dir: PathBuf,
    /// Whether this was the pod's last container waiting for devices.
    pub last: bool,
    /// GPU UUIDs the kubelet chose that differ from the allocation's (it
    /// ignored our preferred allocation); the allocation's devices are used.
    pub mismatched: Vec<String>,
}

impl Grant {
    /// The container as its sharing mode serves it, under `settings`.
    pub fn to_serve(&self, settings: &NodeSettings) -> Container {
        Container {
            holder: format!("{}/{}", self.namespace, self.allocation),
            name: self.container.clone(),
            slices: self.slices.clone(),
            priority: self.priority,
            region_dir: self.region_dir.clone(),
            settings: settings.clone(),
        }
    }
}

/// The device plugin's serialisation of a container's [`Contract`]: its
/// devices as `list` passes them (the variable, CDI names, an annotation
/// keyed by `pod_uid`), its environment and its mounts.
pub fn answer(contract: Contract, list: &DeviceList, pod_uid: &str) -> ContainerAllocateResponse {
    let visible: Vec<&str> = contract.visible.iter().map(String::as_str).collect();
    let listed = list.list(&visible, pod_uid);
    let mut envs = contract.envs;
    envs.extend(listed.envs);
    ContainerAllocateResponse {
        envs: envs.into_iter().collect(),
        mounts: contract
            .mounts
            .into_iter()
            .map(|m| Mount {
                container_path: m.container_path,
                host_path: m.host_path.display().to_string(),
                read_only: m.read_only,
            })
            .collect(),
        annotations: listed.annotations.into_iter().collect(),
        cdi_devices: listed
            .cdi_devices
            .into_iter()
            .map(|name| CdiDevice { name })
            .collect(),
        ..Default::default()
    }
}

/// Decides which container of the lock holder the kubelet asks for, with
/// its region directory under `paths`.
pub fn grant(
    node: &str,
    lock: Option<&NodeLock>,
    allocation: Option<&VgpuAllocation>,
    requested: &[String],
    paths: &HostPaths,
) -> Result<Grant, AllocateError> {
    let lock = lock.ok_or_else(|| AllocateError::NoLock { node: node.into() })?;
    let holder = &lock.spec.holder;
    let pod = format!("{}/{}", holder.namespace, holder.name);
    let no_allocation = |detail: String| AllocateError::NoAllocation {
        node: node.into(),
        pod: pod.clone(),
        detail,
    };
    let allocation = allocation
        .ok_or_else(|| no_allocation(format!("{} does not exist (yet)", lock.spec.allocation)))?;
    if allocation.spec.pod_uid != holder.uid {
        return Err(no_allocation(format!(
            "{} belongs to pod UID {}, not the holder's {}",
            lock.spec.allocation, allocation.spec.pod_uid, holder.uid
        )));
    }
    if allocation.spec.node_name != node {
        return Err(no_allocation(format!(
            "{} is for node {}",
            lock.spec.allocation, allocation.spec.node_name
        )));
    }
    let served: &[String] = allocation
        .status
        .as_ref()
        .map_or(&[], |s| s.served_containers.as_slice());
    let mut waiting = allocation
        .spec
        .containers
        .iter()
        .filter(|c| !c.devices.is_empty() && !served.contains(&c.name));
    let Some(container) = waiting.next() else {
        return Err(AllocateError::AlreadyServed {
            pod,
            served: served.join(", "),
        });
    };
    let last = waiting.next().is_none();
    // The region directory is named after the pod and the container: both
    // come from the allocation object, so a `/` in either (`../../etc`,
    // `/etc`) would put a host directory, mounted read-write into the
    // container, outside the regions root.
    let region_name = allocation.region_name(&container.name);
    if region_name.contains(['/', '\0']) {
        return Err(no_allocation(format!(
            "{} has pod UID {:?} and container {:?}, which do not make one directory name under the regions root",
            lock.spec.allocation, allocation.spec.pod_uid, container.name
        )));
    }
    if requested.len() != container.devices.len() {
        return Err(AllocateError::CountMismatch {
            pod,
            container: container.name.clone(),
            requested: requested.len(),
            allocated: container.devices.len(),
        });
    }

    let uuids: Vec<&str> = container.devices.iter().map(|d| d.uuid.as_str()).collect();
    let mismatched = requested
        .iter()
        .map(|id| uuid_of(id))
        .filter(|uuid| !uuids.contains(uuid))
        .map(str::to_owned)
        .collect();
    Ok(Grant {
        namespace: holder.namespace.clone(),
        allocation: lock.spec.allocation.clone(),
        pod_uid: allocation.spec.pod_uid.clone(),
        container: container.name.clone(),
        slices: container.devices.clone(),
        priority: container.priority,
        region_dir: paths.regions.join(region_name),
        last,
        mismatched,
    })
}

/// The status that records `grant`'s container as served (with the MIG
/// instances `made` for it, and `Allocated` at `now` after the pod's last
/// container), or `None` when there is nothing to write: an earlier
/// attempt recorded it, or the allocation was released meanwhile (its pod
/// finished or was deleted while the write was retried). A released
/// allocation is never made live again: its slices may already be another
/// pod's.
pub fn served_status(
    allocation: &VgpuAllocation,
    grant: &Grant,
    made: &[ServedMigInstance],
    now: Time,
) -> Option<VgpuAllocationStatus> {
    let current = allocation.status.clone().unwrap_or_default();
    if current.served_containers.contains(&grant.container) || !allocation.is_live() {
        return None;
    }
    let mut served_containers = current.served_containers;
    served_containers.push(grant.container.clone());
    let mut mig_instances = current.mig_instances;
    mig_instances.extend(made.iter().cloned());
    let last = grant.last;
    Some(VgpuAllocationStatus {
        served_containers,
        mig_instances,
        phase: last.then_some(AllocationPhase::Allocated),
        allocated_at: last.then_some(now),
        ..VgpuAllocationStatus::default()
    })
}

/// The device IDs to prefer for the lock holder's next container: replicas
/// of the GPUs its allocation names, one per GPU, from those available;
/// `None` when there is nothing to steer by (the kubelet then chooses).
pub fn preferred(
    lock: Option<&NodeLock>,
    allocation: Option<&VgpuAllocation>,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Option<Vec<String>> {
    let lock = lock?;
    let allocation = allocation.filter(|a| a.spec.pod_uid == lock.spec.holder.uid)?;
    let served: &[String] = allocation
        .status
        .as_ref()
        .map_or(&[], |s| s.served_containers.as_slice());
    let container = allocation
        .spec
        .containers
        .iter()
        .find(|c| !c.devices.is_empty() && !served.contains(&c.name))?;
    let mut chosen: Vec<String> = must_include.to_vec();
    for device in &container.devices {
        if chosen.len() >= size {
            break;
        }
        if chosen.iter().any(|id| uuid_of(id) == device.uuid) {
            continue;
        }
        if let Some(id) = available
            .iter()
            .find(|id| uuid_of(id) == device.uuid && !chosen.contains(id))
        {
            chosen.push(id.clone());
        }
    }
    (chosen.len() == size).then_some(chosen)
}

#[cfg(test)]
mod tests;
