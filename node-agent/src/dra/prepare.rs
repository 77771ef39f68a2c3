//! What a prepared ResourceClaim gives its containers. Pure: no I/O.
//!
//! The scheduler's DynamicResources plugin allocated the claim: each result
//! names a device of this node's pool and the capacity the claim consumes
//! of it (`memory`, `cores`). The container gets exactly what Allocate gives
//! a device-plugin container: the GPUs in `NVIDIA_VISIBLE_DEVICES`, the
//! interposer's limits and its mounts, here as the edits of one CDI device
//! named after the claim (kind [`CDI_KIND`]), which containerd applies. The
//! variables number the claim's GPUs from 0, so a container takes its GPUs
//! from one claim (two claims' variables would collide).

use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use tessera_api::{env, quantity, v1alpha1::GpuDevice, v1alpha1::NodeSettings};

use super::{CDI_KIND, DRIVER, device_name};
use crate::{
    Error,
    plugin::{HostPaths, interposer_mounts, slice_env},
};

/// One GPU of a claim and the share of it the claim holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimGpu {
    /// The GPU's UUID.
    pub uuid: String,
    /// MiB of its memory.
    pub memory_mib: u64,
    /// Percent of its SMs (0: no limit).
    pub cores: u32,
}

fn claim_error(claim: &ResourceClaim, message: String) -> Error {
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
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .ok_or_else(|| claim_error(claim, "is not allocated".into()))?;
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
        gpus.push(ClaimGpu {
            uuid: gpu.uuid.clone(),
            memory_mib,
            cores,
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

/// The CDI spec of claim `uid`: one device, named after the claim, whose
/// edits give a container the claim's GPUs and the interposer limiting it
/// to its share, with its region directory `region_dir`.
pub fn cdi_spec(
    uid: &str,
    gpus: &[ClaimGpu],
    settings: &NodeSettings,
    paths: &HostPaths,
    region_dir: &Path,
) -> Value {
    let memories: Vec<u64> = gpus.iter().map(|g| g.memory_mib).collect();
    let cores = gpus.iter().map(|g| g.cores).max().unwrap_or(0);
    let mut envs = slice_env(&memories, cores, None, settings);
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    envs.insert(env::NVIDIA_VISIBLE_DEVICES.to_owned(), uuids.join(","));
    let mounts: Vec<Value> = interposer_mounts(paths, region_dir)
        .into_iter()
        .map(|m| {
            let access = if m.read_only { "ro" } else { "rw" };
            json!({
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": [access, "nosuid", "nodev", "bind"],
            })
        })
        .collect();
    json!({
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [{
            "name": uid,
            "containerEdits": {
                "env": envs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
                "mounts": mounts,
            },
        }],
    })
}

#[cfg(test)]
mod tests;
