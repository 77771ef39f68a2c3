//! The simulated GPU nodes: a Node per node that kwok plays the kubelet of,
//! and its GpuNode written by the node agent's own publisher
//! ([`tessera_node_agent::publish::publish_once`]) from fake physical GPUs
//! under the node's settings ([`tessera_node_agent::settings::offered`]), so
//! the extender reads exactly what a real agent would write. Simulated nodes
//! have no agent: no Lease, no agent pod, no device-plugin Allocate.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::PostParams};
use serde_json::json;
use tessera_api::{node_config::resolve, v1alpha1::NodeSettings};
use tessera_node_agent::{
    backend::PhysicalGpu, inventory::Offer, publish::publish_once, settings::offered,
};

use crate::Error;

/// The GPU model every simulated GPU is.
pub const MODEL: &str = "NVIDIA H100 80GB HBM3";
/// Its memory in MiB.
pub const GPU_MIB: u64 = 81_559;
/// The label every simulated node carries (`tessera.dev/simulated=kwok`).
pub const LABEL: (&str, &str) = ("tessera.dev/simulated", "kwok");
/// Requests in flight while creating the fleet.
const CONCURRENCY: usize = 32;

/// The shape of the fleet.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// How many nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus: u32,
    /// Slices per GPU (`deviceSplitCount`).
    pub split: u32,
}

/// The name of simulated node `i`.
pub fn node_name(i: usize) -> String {
    format!("sim-{i:05}")
}

/// The UUID of GPU `gpu` of node `node`, spelled as NVIDIA does.
pub fn gpu_uuid(node: usize, gpu: u32) -> String {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&(node as u64).to_be_bytes());
    bytes[8..12].copy_from_slice(&gpu.to_be_bytes());
    bytes[12..].copy_from_slice(b"kwok");
    tessera_api::names::gpu_uuid_string(&bytes)
}

/// The fake physical GPUs of node `node`: two NUMA nodes, NVLink within each.
pub fn physical_gpus(node: usize, gpus: u32) -> Vec<PhysicalGpu> {
    (0..gpus)
        .map(|index| {
            let numa = index * 2 / gpus.max(1);
            PhysicalGpu {
                uuid: gpu_uuid(node, index),
                index,
                model: MODEL.to_owned(),
                memory_mib: GPU_MIB,
                numa_node: Some(numa),
                nvlink_peers: (0..gpus)
                    .filter(|&peer| peer != index && peer * 2 / gpus.max(1) == numa)
                    .map(|peer| gpu_uuid(node, peer))
                    .collect(),
                compute_capability: None,
                driver_version: None,
                health: tessera_api::v1alpha1::DeviceHealth::Healthy,
                health_message: None,
                mig: None,
            }
        })
        .collect()
}

/// What the agent of node `name` would offer for `physical` GPUs with
/// `split` slices each and no GpuNodeConfig.
pub fn offer(name: &str, physical: &[PhysicalGpu], split: u32) -> Offer {
    let defaults = NodeSettings {
        device_split_count: split,
        ..NodeSettings::default()
    };
    let labels = BTreeMap::from([(LABEL.0.to_owned(), LABEL.1.to_owned())]);
    let resolved = resolve(name, &labels, &defaults, &[]);
    let devices = offered(physical, &resolved.settings, &Default::default());
    Offer { resolved, devices }
}

/// The Node object of a simulated node: handed to kwok, room for 110 pods.
pub fn node_object(name: &str) -> Node {
    let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {tessera_e2e::KWOK_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                LABEL.0: LABEL.1,
                "gpu": "on",
            },
        },
        "status": {"allocatable": resources, "capacity": resources},
    }))
    .unwrap_or_default()
}

/// Creates the fleet's Nodes and publishes their GpuNodes; returns the
/// node names.
pub async fn create(client: &Client, shape: Shape) -> Result<Vec<String>, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..shape.nodes).map(node_name).collect();
    stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let nodes = nodes.clone();
            async move {
                match nodes
                    .create(&PostParams::default(), &node_object(name))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                    Err(e) => return Err(Error::kube(format!("creating Node {name}"))(e)),
                }
                publish(client, i, name, shape).await
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    Ok(names)
}

/// Publishes simulated node `i`'s GpuNode as its agent would.
pub async fn publish(client: &Client, i: usize, name: &str, shape: Shape) -> Result<(), Error> {
    let offer = offer(name, &physical_gpus(i, shape.gpus), shape.split);
    publish_once(client, name, &offer)
        .await
        .map_err(|source| Error::Publish {
            node: name.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_distinct_and_offered_whole() {
        let physical = physical_gpus(42, 8);
        let offer = offer("sim-00042", &physical, 10);
        assert_eq!(offer.devices.len(), 8);
        let uuids: std::collections::BTreeSet<_> = offer.devices.iter().map(|d| &d.uuid).collect();
        assert_eq!(uuids.len(), 8);
        assert_ne!(gpu_uuid(1, 0), gpu_uuid(0, 1));
        assert!(offer.devices.iter().all(|d| d.split_count == 10
            && d.capacity.memory_mib == GPU_MIB
            && d.capacity.cores == 100));
        assert_eq!(physical[0].nvlink_peers.len(), 3);
        assert_eq!(physical[7].numa_node, Some(1));
    }
}
