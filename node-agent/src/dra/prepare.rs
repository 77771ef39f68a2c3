//! What a prepared ResourceClaim gives its containers. Pure: no I/O.
//!
//! The scheduler's DynamicResources plugin allocated the claim: each result
//! names a device of this node's pool, the request it serves and the
//! capacity the claim consumes of it (`memory`, `cores`). A container gets
//! exactly what Allocate gives a device-plugin container, the same
//! hami-core [`Contract`]: the GPUs in `NVIDIA_VISIBLE_DEVICES`, the
//! interposer's limits and its mounts. Here they are the edits of one CDI
//! device per request of the claim, named
//! `<claim UID>-<request>` (kind [`CDI_KIND`]), which containerd applies to
//! every container that references the request (or the whole claim).
//!
//! The variables number a request's GPUs from 0, so a container takes its
//! GPUs from one request: a container that references two requests (or a
//! claim with two) gets both devices' edits, and the later one's
//! `NVIDIA_VISIBLE_DEVICES` and limits win.

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use tessera_api::{
    env, quantity,
    v1alpha1::{DeviceSlice, GpuDevice, NodeSettings},
};
use tessera_draplugin::dra::v1::Device;

use tessera_api::names::dra::{CDI_KIND, DRIVER};

use super::slice::device_name;
use crate::{
    Error,
    claims::allocation_results,
    contract::{Contract, HostPaths, MountSpec},
    sharing::{Container, hami_core},
};

/// One GPU of a claim and the share of it the claim holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimGpu {
    /// The request of the claim it serves (the parent's name for a
    /// `firstAvailable` subrequest: containers reference that).
    pub request: String,
    /// The device's name in the node's pool (`gpu-<index>`).
    pub device: String,
    /// The GPU's UUID.
    pub uuid: String,
    /// The GPU's index on the node.
    pub index: u32,
    /// The GPU's model.
    pub model: String,
    /// MiB of its memory.
    pub memory_mib: u64,
    /// Percent of its SMs (0: no limit).
    pub cores: u32,
    /// The share's ID, when the device is shared (consumable capacity).
    pub share_id: Option<String>,
}

/// An error about claim `claim`, naming it.
pub fn claim_error(claim: &ResourceClaim, message: impl std::fmt::Display) -> Error {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    Error::Dra(format!("ResourceClaim {namespace}/{name}: {message}"))
}

/// The GPUs of `node` the claim was allocated, with the capacity it
/// consumes of each; results of other drivers or pools are not ours. A
/// result without `memory` holds the GPU's whole memory and one without
/// `cores` consumes none (the capacities' policy defaults).
pub fn claim_gpus(
    claim: &ResourceClaim,
    node: &str,
    offer: &[GpuDevice],
) -> Result<Vec<ClaimGpu>, Error> {
    let results =
        allocation_results(claim).ok_or_else(|| claim_error(claim, "is not allocated"))?;
    let mut gpus = Vec::new();
    for result in results
        .iter()
        .filter(|r| r.driver == DRIVER && r.pool == node)
    {
        let gpu = offer
            .iter()
            .find(|d| device_name(d.index) == result.device)
            .ok_or_else(|| {
                claim_error(
                    claim,
                    format!(
                        "device {} of pool {node} is not one this node offers",
                        result.device
                    ),
                )
            })?;
        let consumed = |name: &str| result.consumed_capacity.as_ref().and_then(|c| c.get(name));
        let memory_mib = match consumed("memory") {
            Some(q) => quantity::bytes_as_mib(&q.0).map_err(|e| {
                claim_error(
                    claim,
                    format!("consumedCapacity.memory of {}: {e}", result.device),
                )
            })?,
            None => gpu.capacity.memory_mib,
        };
        // The scheduler keeps a share within the device's capacity; a
        // result that does not is refused rather than handed on.
        if memory_mib == 0 || memory_mib > gpu.capacity.memory_mib {
            return Err(claim_error(
                claim,
                format!(
                    "consumedCapacity.memory of {}: {memory_mib} MiB is not 1 to the device's {} MiB",
                    result.device, gpu.capacity.memory_mib
                ),
            ));
        }
        let cores = match consumed("cores") {
            Some(q) => quantity::whole(&q.0)
                .ok()
                .and_then(|c| u32::try_from(c).ok())
                .filter(|c| *c <= 100)
                .ok_or_else(|| {
                    claim_error(
                        claim,
                        format!(
                            "consumedCapacity.cores of {}: {:?} is not 0 to 100",
                            result.device, q.0
                        ),
                    )
                })?,
            None => 0,
        };
        let request = result
            .request
            .split_once('/')
            .map_or(result.request.as_str(), |(parent, _)| parent);
        // It names a CDI device and a region directory: only what the API
        // server lets a claim's request be named (a DNS label) is used.
        if !dns_label(request) {
            return Err(claim_error(
                claim,
                format!(
                    "request {:?} of {} is not a DNS label",
                    result.request, result.device
                ),
            ));
        }
        gpus.push(ClaimGpu {
            request: request.to_owned(),
            device: result.device.clone(),
            uuid: gpu.uuid.clone(),
            index: gpu.index,
            model: gpu.model.clone(),
            memory_mib,
            cores,
            share_id: result.share_id.clone(),
        });
    }
    if gpus.is_empty() {
        return Err(claim_error(
            claim,
            format!("has no device of driver {DRIVER} in pool {node}"),
        ));
    }
    Ok(gpus)
}

/// Whether `name` is a DNS label (RFC 1123: 1 to 63 lowercase letters,
/// digits and `-`, starting and ending with a letter or digit).
fn dns_label(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
}

/// The claim's requests in first-result order, each with its GPUs.
pub fn by_request(gpus: &[ClaimGpu]) -> Vec<(&str, Vec<&ClaimGpu>)> {
    let mut requests: Vec<(&str, Vec<&ClaimGpu>)> = Vec::new();
    for gpu in gpus {
        match requests.iter_mut().find(|(r, _)| *r == gpu.request) {
            Some((_, list)) => list.push(gpu),
            None => requests.push((&gpu.request, vec![gpu])),
        }
    }
    requests
}

/// A request's GPUs with two shares of one GPU (a request for two devices
/// that the scheduler placed on the same shareable GPU) made one share of
/// their sum, in first-result order: a container sees each GPU once.
pub fn merged(gpus: &[&ClaimGpu]) -> Vec<ClaimGpu> {
    let mut merged: Vec<ClaimGpu> = Vec::new();
    for gpu in gpus {
        match merged.iter_mut().find(|m| m.uuid == gpu.uuid) {
            Some(share) => {
                share.memory_mib += gpu.memory_mib;
                share.cores = (share.cores + gpu.cores).min(100);
            }
            None => merged.push((*gpu).clone()),
        }
    }
    merged
}

/// The name of the CDI device of one request of claim `uid`.
pub fn cdi_device(uid: &str, request: &str) -> String {
    format!("{uid}-{request}")
}

/// The region directory name of one request of claim `uid` (see
/// `VgpuAllocation::region_name`: the mirror's owner is the claim).
pub fn region_name(uid: &str, request: &str) -> String {
    format!("{uid}_{request}")
}

/// Each request of claim `uid` as the container hami-core serves: the
/// request's GPUs (two shares of one GPU merged) with its region directory
/// under `paths.regions`. The DRA door serves hami-core slices only.
pub fn request_containers(
    uid: &str,
    gpus: &[ClaimGpu],
    settings: &NodeSettings,
    paths: &HostPaths,
) -> Vec<(String, Container)> {
    by_request(gpus)
        .into_iter()
        .map(|(request, gpus)| {
            let slices = merged(&gpus)
                .into_iter()
                .map(|gpu| DeviceSlice {
                    uuid: gpu.uuid,
                    index: gpu.index,
                    model: gpu.model,
                    memory_mib: gpu.memory_mib,
                    cores: gpu.cores,
                    ..DeviceSlice::default()
                })
                .collect();
            let container = Container {
                holder: format!("claim {uid}"),
                name: request.to_owned(),
                slices,
                priority: None,
                region_dir: paths.regions.join(region_name(uid, request)),
                settings: settings.clone(),
            };
            (request.to_owned(), container)
        })
        .collect()
}

/// The CDI spec of claim `uid`: one device per request, whose edits give a
/// container the request's GPUs and the interposer limiting it to its
/// share, exactly as hami-core's [`Contract`] says.
pub fn cdi_spec(uid: &str, gpus: &[ClaimGpu], settings: &NodeSettings, paths: &HostPaths) -> Value {
    let contracts: Vec<(String, Contract)> = request_containers(uid, gpus, settings, paths)
        .into_iter()
        .map(|(request, container)| (request, hami_core::contract(&container, paths)))
        .collect();
    cdi_spec_of(uid, &contracts)
}

/// The DRA door's serialisation of each request's [`Contract`]: a CDI
/// device whose edits set the contract's environment and the devices in
/// `NVIDIA_VISIBLE_DEVICES`, and bind its mounts.
pub fn cdi_spec_of(uid: &str, contracts: &[(String, Contract)]) -> Value {
    let devices: Vec<Value> = contracts
        .iter()
        .map(|(request, contract)| {
            let mut envs = contract.envs.clone();
            envs.insert(
                env::NVIDIA_VISIBLE_DEVICES.to_owned(),
                contract.visible.join(","),
            );
            json!({
                "name": cdi_device(uid, request),
                "containerEdits": {
                    "env": envs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
                    "mounts": cdi_mounts(&contract.mounts),
                },
            })
        })
        .collect();
    json!({
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": devices,
    })
}

fn cdi_mounts(mounts: &[MountSpec]) -> Vec<Value> {
    mounts
        .iter()
        .map(|m| {
            let access = if m.read_only { "ro" } else { "rw" };
            json!({
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": [access, "nosuid", "nodev", "bind"],
            })
        })
        .collect()
}

/// The devices NodePrepareResources answers for claim `uid`: every GPU
/// result, with the request's CDI device on the first GPU of each request
/// only (the kubelet hands a container the CDI devices of every result of
/// the requests it references, and does not remove duplicates).
pub fn prepared_devices(uid: &str, node: &str, gpus: &[ClaimGpu]) -> Vec<Device> {
    let mut seen: Vec<&str> = Vec::new();
    gpus.iter()
        .map(|gpu| {
            let first = !seen.contains(&gpu.request.as_str());
            seen.push(&gpu.request);
            Device {
                request_names: vec![gpu.request.clone()],
                pool_name: node.to_owned(),
                device_name: gpu.device.clone(),
                cdi_device_ids: if first {
                    vec![format!("{CDI_KIND}={}", cdi_device(uid, &gpu.request))]
                } else {
                    Vec::new()
                },
                share_id: gpu.share_id.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
