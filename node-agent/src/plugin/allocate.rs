//! What the agent answers to the kubelet's Allocate, decided from the
//! node's NodeLock and the holder's VgpuAllocation alone. Pure: no I/O.
//!
//! The kubelet's Allocate carries device IDs but no pod. The scheduler
//! extender binds at most one GPU pod per node between its NodeLock and
//! this call, so the lock names the pod; its allocation names the devices
//! and limits of each container, and the kubelet asks for the containers in
//! pod spec order (init containers first), which is the allocation's order.

use std::{collections::BTreeMap, path::PathBuf};

use tessera_api::v1alpha1::{MigSlice, NodeLock, NodeSettings, VgpuAllocation};

use super::{device_list::DeviceList, ids::uuid_of};
pub use crate::error::AllocateError;
use crate::{
    contract::{HostPaths, MountSpec, interposer_mounts, slice_env},
    mps::{self, MpsDaemon},
};

/// The answer for one container, and what to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Namespace of the pod served.
    pub namespace: String,
    /// The allocation (= pod) name.
    pub allocation: String,
    /// The container served.
    pub container: String,
    /// The GPUs' UUIDs, in the container's CUDA order.
    pub devices: Vec<String>,
    /// Environment for the container.
    pub envs: BTreeMap<String, String>,
    /// Container annotations (the `cdi-annotations` strategy).
    pub annotations: BTreeMap<String, String>,
    /// Fully-qualified CDI device names (the `cdi-cri` strategy).
    pub cdi_devices: Vec<String>,
    /// Mounts for the container.
    pub mounts: Vec<MountSpec>,
    /// The container's region directory on the host (the agent creates it,
    /// unless the container gets MIG instances and no interposer).
    pub region_dir: PathBuf,
    /// Whether this was the pod's last container waiting for devices.
    pub last: bool,
    /// GPU UUIDs the kubelet chose that differ from the allocation's (it
    /// ignored our preferred allocation); the allocation's devices are used.
    pub mismatched: Vec<String>,
    /// The MIG instances to create first, per GPU in `devices` order, when
    /// the container's slices are dynamic-MIG instances; the devices are
    /// then the instances' UUIDs ([`Grant::with_mig_devices`]).
    pub mig: Vec<(String, MigSlice)>,
}

impl Grant {
    /// The grant once its MIG instances exist: the container sees the
    /// instances (`uuids`, in `mig` order) instead of their GPUs, and gets
    /// neither the interposer nor its limits (the hardware isolates it;
    /// HAMi's MIG mode does the same).
    pub fn with_mig_devices(
        mut self,
        uuids: Vec<String>,
        list: &DeviceList,
        pod_uid: &str,
    ) -> Self {
        let ids: Vec<&str> = uuids.iter().map(String::as_str).collect();
        let listed = list.list(&ids, pod_uid);
        self.envs = listed.envs;
        self.annotations = listed.annotations;
        self.cdi_devices = listed.cdi_devices;
        self.mounts.clear();
        self.devices = uuids;
        self
    }
}

impl Grant {
    /// The grant for a container on an MPS GPU: the GPU, and the client's
    /// part of its daemon ([`mps::client_share`]); no interposer, no region
    /// directory.
    pub fn with_mps(mut self, daemon: &MpsDaemon, memory_mib: u64, cores: u32) -> Self {
        let (envs, mounts) = mps::client_share(daemon, memory_mib, cores);
        self.envs
            .retain(|k, _| k.as_str() == tessera_api::env::NVIDIA_VISIBLE_DEVICES);
        self.envs.extend(envs);
        self.mounts = mounts;
        self
    }
}

/// Decides the answer for one container of the lock holder; `list` says
/// how the devices are passed to the container runtime.
pub fn grant(
    node: &str,
    lock: Option<&NodeLock>,
    allocation: Option<&VgpuAllocation>,
    requested: &[String],
    settings: &NodeSettings,
    paths: &HostPaths,
    list: &DeviceList,
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
    let listed = list.list(&uuids, &allocation.spec.pod_uid);
    let mut envs = listed.envs;
    let memories: Vec<u64> = container.devices.iter().map(|d| d.memory_mib).collect();
    let cores = container.devices.iter().map(|d| d.cores).max().unwrap_or(0);
    envs.extend(slice_env(&memories, cores, container.priority, settings));

    let region_dir = paths.regions.join(region_name);
    let mounts = interposer_mounts(paths, &region_dir);
    let mismatched = requested
        .iter()
        .map(|id| uuid_of(id))
        .filter(|uuid| !uuids.contains(uuid))
        .map(str::to_owned)
        .collect();
    Ok(Grant {
        namespace: holder.namespace.clone(),
        allocation: lock.spec.allocation.clone(),
        container: container.name.clone(),
        devices: uuids.iter().map(|&u| u.to_owned()).collect(),
        envs,
        annotations: listed.annotations,
        cdi_devices: listed.cdi_devices,
        mounts,
        region_dir,
        last,
        mismatched,
        mig: container
            .devices
            .iter()
            .filter_map(|d| Some((d.uuid.clone(), d.mig.clone()?)))
            .collect(),
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
