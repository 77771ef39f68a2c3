//! Plugins that read the devices' indexes from one pod annotation: Moore
//! Threads (`mthreads.com/gpu-index`), AWS Neuron (`AWS_NEURON_IDS`) and
//! Kunlunxin's whole XPUs (`BAIDU_COM_DEVICE_IDX`).
//!
//! Their plugins are closed (Moore Threads' CloudNative Toolkit, AWS's
//! `neuron-device-plugin` image, Kunlunxin's `xpu-device`): what HAMi
//! writes for them is the protocol's only public source (HAMi
//! `pkg/device/mthreads/device.go`, `awsneuron/device.go`,
//! `kunlun/device.go` `PatchAnnotations`; `docs/developers/
//! kunlunxin-topology.md`). How each plugin finds its pod follows the keys
//! HAMi writes for it:
//!
//! - Moore Threads: the pending pod whose `mthreads.com/predicate-node` is
//!   the node, oldest `mthreads.com/predicate-time` first;
//! - AWS Neuron: the pending pod of the node (`aws.amazon.com/predicate-node`)
//!   with `NEURON_ALLOCATED: "false"`, oldest `NEURON_ALLOC_TIME` first;
//!   it is marked `NEURON_ALLOCATED: "true"` once served;
//! - Kunlunxin: HAMi's `GetPendingPod` (`hami.io/vgpu-node`,
//!   `hami.io/bind-phase`), then `bind-phase: success`.
//!
//! The kubelet calls Allocate once per resource of the container; the
//! count resource's call checks the number of indexes against the devices
//! the kubelet picked.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tessera_api::names::{kunlun, mthreads, neuron};

use super::types::{MockDevice, Registration};

/// Moore Threads' resources: whole cards, core groups, memory.
pub const MT_VGPU: &str = "mthreads.com/vgpu";
/// 16 per card.
pub const MT_CORES: &str = "mthreads.com/sgpu-core";
/// 512 MiB units.
pub const MT_MEMORY: &str = "mthreads.com/sgpu-memory";
/// AWS Neuron devices.
pub const NEURON: &str = "aws.amazon.com/neuron";
/// AWS NeuronCores.
pub const NEURON_CORES: &str = "aws.amazon.com/neuroncore";
/// Kunlunxin's whole XPUs.
pub const XPU: &str = "kunlunxin.com/xpu";

fn ids(
    devices: &[MockDevice],
    suffix: &str,
    per_device: impl Fn(&MockDevice) -> u64,
) -> Vec<String> {
    devices
        .iter()
        .flat_map(|d| (0..per_device(d)).map(move |k| format!("{}-{suffix}-{k}", d.id)))
        .collect()
}

fn registration(resource: &str, socket: &str, devices: Vec<String>) -> Registration {
    Registration {
        resource: resource.into(),
        socket: socket.into(),
        devices,
    }
}

/// Moore Threads: `count` vGPUs per card, 16 core groups, its memory in
/// 512 MiB units.
pub fn mthreads(devices: &[MockDevice]) -> Vec<Registration> {
    vec![
        registration(
            MT_VGPU,
            "mthreads-vgpu.sock",
            ids(devices, "vgpu", |d| d.count.into()),
        ),
        registration(
            MT_CORES,
            "mthreads-sgpu-core.sock",
            ids(devices, "core", |_| mthreads::CORES_PER_CARD.into()),
        ),
        registration(
            MT_MEMORY,
            "mthreads-sgpu-memory.sock",
            ids(devices, "mem", |d| d.memory_mib / mthreads::MEMORY_UNIT_MIB),
        ),
    ]
}

/// AWS Neuron: each device, and its `cores` NeuronCores.
pub fn neuron(devices: &[MockDevice]) -> Vec<Registration> {
    vec![
        registration(NEURON, "neuron.sock", ids(devices, "device", |_| 1)),
        registration(
            NEURON_CORES,
            "neuroncore.sock",
            ids(devices, "core", |d| d.cores.into()),
        ),
    ]
}

/// Kunlunxin: each XPU.
pub fn kunlunxin(devices: &[MockDevice]) -> Vec<Registration> {
    vec![registration(
        XPU,
        "kunlunxin-xpu.sock",
        ids(devices, "xpu", |_| 1),
    )]
}

/// The pending pod of `node` whose `node_key` names it and `flag` (when
/// given) says `false`, oldest `time_key` first.
fn oldest<'a>(
    pods: &'a [Pod],
    node: &str,
    node_key: &str,
    time_key: &str,
    flag: Option<&str>,
) -> Result<&'a Pod, String> {
    pods.iter()
        .filter(|p| {
            let a = p.annotations();
            a.get(node_key).map(String::as_str) == Some(node)
                && flag.is_none_or(|f| a.get(f).map(String::as_str) == Some("false"))
        })
        .filter_map(|p| Some((p, p.annotations().get(time_key)?.parse::<u128>().ok()?)))
        .min_by_key(|(_, time)| *time)
        .map(|(p, _)| p)
        .ok_or_else(|| format!("no pending pod on node {node} with {node_key}"))
}

/// The pod a Moore Threads plugin serves among the node's pending `pods`.
pub fn mthreads_pod<'a>(pods: &'a [Pod], node: &str) -> Result<&'a Pod, String> {
    oldest(
        pods,
        node,
        mthreads::PREDICATE_NODE,
        mthreads::PREDICATE_TIME,
        None,
    )
}

/// The pod an AWS Neuron plugin serves among the node's pending `pods`.
pub fn neuron_pod<'a>(pods: &'a [Pod], node: &str) -> Result<&'a Pod, String> {
    oldest(
        pods,
        node,
        neuron::PREDICATE_NODE,
        neuron::PREDICATE_TIME,
        Some(neuron::ALLOCATED_FLAG),
    )
}

/// The indexes in the pod's `key`, checked against the devices the kubelet
/// picked when `resource` is the one they count.
fn indexes(pod: &Pod, key: &str, counted: bool, picked: usize) -> Result<String, String> {
    let value = pod
        .annotations()
        .get(key)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("pod {} has no {key}", pod.name_any()))?;
    let n = value.split(',').count();
    if counted && n != picked {
        return Err(format!(
            "device number not matched: {key} has {n}, request has {picked}"
        ));
    }
    Ok(value.clone())
}

/// A Moore Threads container's variables (`MTHREADS_VISIBLE_DEVICES`, the
/// toolkit's variable) for a call of `resource` with `picked` devices.
pub fn mthreads_env(
    pod: &Pod,
    resource: &str,
    picked: usize,
) -> Result<BTreeMap<String, String>, String> {
    let gpus = indexes(pod, mthreads::GPU_INDEX, resource == MT_VGPU, picked)?;
    Ok(BTreeMap::from([(
        "MTHREADS_VISIBLE_DEVICES".to_owned(),
        gpus,
    )]))
}

/// An AWS Neuron container's variables: `NEURON_RT_VISIBLE_CORES` when the
/// pod asked for cores (`NEURON_RESOURCE_TYPE`), else
/// `AWS_NEURON_VISIBLE_DEVICES`.
pub fn neuron_env(
    pod: &Pod,
    resource: &str,
    picked: usize,
) -> Result<BTreeMap<String, String>, String> {
    let kind = pod
        .annotations()
        .get(neuron::RESOURCE_TYPE)
        .map_or(NEURON, String::as_str);
    let ids = indexes(pod, neuron::ASSIGNED_INDEX, resource == kind, picked)?;
    let var = if kind == NEURON_CORES {
        "NEURON_RT_VISIBLE_CORES"
    } else {
        "AWS_NEURON_VISIBLE_DEVICES"
    };
    Ok(BTreeMap::from([(var.to_owned(), ids)]))
}

/// A Kunlunxin container's variables: its XPUs in `XPU_VISIBLE_DEVICES`.
pub fn kunlunxin_env(pod: &Pod, picked: usize) -> Result<BTreeMap<String, String>, String> {
    let xpus = indexes(pod, kunlun::DEVICE_IDX, true, picked)?;
    Ok(BTreeMap::from([("XPU_VISIBLE_DEVICES".to_owned(), xpus)]))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}}))
            .unwrap()
    }

    #[test]
    fn the_oldest_pod_placed_on_the_node_is_served() {
        let pods = [
            pod(
                "late",
                json!({mthreads::PREDICATE_NODE: "n", mthreads::PREDICATE_TIME: "20", mthreads::GPU_INDEX: "1"}),
            ),
            pod(
                "early",
                json!({mthreads::PREDICATE_NODE: "n", mthreads::PREDICATE_TIME: "10", mthreads::GPU_INDEX: "0"}),
            ),
            pod(
                "elsewhere",
                json!({mthreads::PREDICATE_NODE: "m", mthreads::PREDICATE_TIME: "1"}),
            ),
        ];
        let served = mthreads_pod(&pods, "n").unwrap();
        assert_eq!(served.name_any(), "early");
        assert_eq!(
            mthreads_env(served, MT_CORES, 16).unwrap()["MTHREADS_VISIBLE_DEVICES"],
            "0"
        );
        assert_eq!(
            mthreads_env(served, MT_VGPU, 2).unwrap_err(),
            "device number not matched: mthreads.com/gpu-index has 1, request has 2"
        );
        assert!(mthreads_pod(&pods, "x").is_err());
    }

    #[test]
    fn neuron_pods_are_served_once_and_by_their_resource_type() {
        let cores = json!({neuron::PREDICATE_NODE: "n", neuron::PREDICATE_TIME: "5",
            neuron::ALLOCATED_FLAG: "false", neuron::ASSIGNED_INDEX: "2,3",
            neuron::RESOURCE_TYPE: NEURON_CORES});
        let served = json!({neuron::PREDICATE_NODE: "n", neuron::PREDICATE_TIME: "1",
            neuron::ALLOCATED_FLAG: "true", neuron::ASSIGNED_INDEX: "0"});
        let pods = [pod("served", served), pod("cores", cores)];
        let p = neuron_pod(&pods, "n").unwrap();
        assert_eq!(p.name_any(), "cores");
        assert_eq!(
            neuron_env(p, NEURON_CORES, 2).unwrap()["NEURON_RT_VISIBLE_CORES"],
            "2,3"
        );
        assert!(neuron_env(p, NEURON_CORES, 1).is_err());
        let devices = pod("d", json!({neuron::ASSIGNED_INDEX: "1"}));
        assert_eq!(
            neuron_env(&devices, NEURON, 1).unwrap()["AWS_NEURON_VISIBLE_DEVICES"],
            "1"
        );
    }

    #[test]
    fn registrations_count_what_the_node_view_reads() {
        let cards = super::super::fleet::devices(2, "MTT-S4000", 49152, 16, None);
        let r = mthreads(&cards);
        assert_eq!(
            r.iter().map(|r| r.devices.len()).collect::<Vec<_>>(),
            [8, 32, 192]
        );
        let inf = super::super::fleet::devices(2, "NEURON", 0, 2, None);
        assert_eq!(neuron(&inf)[1].devices.len(), 4);
        assert_eq!(
            kunlunxin(&cards)[0].devices,
            ["MTT-S4000-0-xpu-0", "MTT-S4000-1-xpu-0"]
        );
    }
}
