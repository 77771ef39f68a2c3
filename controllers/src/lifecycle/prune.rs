//! What the lifecycle controllers keep of the Pods and Nodes they watch:
//! only the fields [`crate::lifecycle_rules`] and the configs controller read. Every
//! Pod of the cluster is in the store, so a full object (specs, env,
//! volumes, every condition) per pod is most of the controller's memory at
//! scale; these are a few hundred bytes.

use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod, PodSpec, PodStatus};

/// Keeps a Pod's identity (name, namespace, UID, resourceVersion, deletion
/// timestamp, owners, labels), `spec.nodeName`, `status.phase` and whether
/// any container or init container has a status (the kubelet admitted it).
pub fn pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    // Only what a vendor plugin answers at Allocate.
    meta.annotations = meta.annotations.take().and_then(|mut a| {
        let phase = a.remove(crate::vendors::handoff::BIND_PHASE)?;
        Some([(crate::vendors::handoff::BIND_PHASE.to_owned(), phase)].into())
    });
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.generate_name = None;
    let node_name = pod.spec.as_mut().and_then(|s| s.node_name.take());
    pod.spec = Some(PodSpec {
        node_name,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        container_statuses: admitted_marker(status.container_statuses.as_deref()),
        init_container_statuses: admitted_marker(status.init_container_statuses.as_deref()),
        ..PodStatus::default()
    });
}

/// One nameless status when there were any: "the kubelet reported containers".
fn admitted_marker(statuses: Option<&[ContainerStatus]>) -> Option<Vec<ContainerStatus>> {
    statuses
        .filter(|s| !s.is_empty())
        .map(|_| vec![ContainerStatus::default()])
}

/// Keeps a Node's name, UID, resourceVersion and labels (what selects a
/// GpuNodeConfig), what vendor device plugins report (the `hami.io/node-*`
/// annotations, `hami-vnpu-core`, MetaX's `metax-tech.com/node-gpu-devices`,
/// Enflame's `enflame.com/gcu-drs-capacity`,
/// and `status.allocatable`); drops the rest
/// of its spec and status (images, conditions, ...).
pub fn node(node: &mut Node) {
    let meta = &mut node.metadata;
    meta.annotations = meta.annotations.take().map(|mut a| {
        a.retain(|key, _| {
            key.starts_with("hami.io/node-")
                || key == tessera_api::names::ascend::NODE_SOFT_SPLIT
                || key == tessera_api::names::metax::NODE_DEVICES
                || key == tessera_api::names::enflame::DRS_CAPACITY
        });
        a
    });
    meta.managed_fields = None;
    node.spec = None;
    node.status = node
        .status
        .take()
        .map(|status| k8s_openapi::api::core::v1::NodeStatus {
            allocatable: status.allocatable,
            ..Default::default()
        });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::lifecycle_rules::{admitted, lock_action, release_reason};

    fn full_pod(phase: &str, statuses: bool) -> Pod {
        let statuses = if statuses {
            json!([{"name": "main", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-11-25T00:00:00Z"}}}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "x"}, "annotations": {"big": "x".repeat(10_000)},
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"nodeName": "n1", "schedulerName": "tessera-scheduler",
                     "containers": [{"name": "main", "image": "i", "env": [{"name": "A", "value": "b"}]}]},
            "status": {"phase": phase, "containerStatuses": statuses,
                       "conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.1"},
        }))
        .unwrap()
    }

    #[test]
    fn a_pruned_pod_decides_as_the_full_one() {
        let now = k8s_openapi::jiff::Timestamp::now();
        let holder = tessera_api::testing::pod_ref("ns", "p", "u1");
        let lock = tessera_api::testing::node_lock("n1", holder, "p", now, 60);
        let allocation = tessera_api::testing::allocation("p", "u1", "n1")
            .namespace("ns")
            .build();
        for (phase, statuses) in [
            ("Pending", false),
            ("Pending", true),
            ("Running", true),
            ("Succeeded", true),
            ("Failed", false),
        ] {
            let full = full_pod(phase, statuses);
            let mut pruned = full.clone();
            pod(&mut pruned);
            assert_eq!(admitted(&pruned), admitted(&full), "{phase} {statuses}");
            assert_eq!(
                release_reason(&allocation, Some(&pruned)),
                release_reason(&allocation, Some(&full))
            );
            assert_eq!(
                lock_action(&lock, Some(&pruned), Some(&allocation), now),
                lock_action(&lock, Some(&full), Some(&allocation), now)
            );
            let size = serde_json::to_vec(&pruned).unwrap().len();
            assert!(size < 400, "pruned pod is {size} bytes");
            assert_eq!(pruned.metadata.uid.as_deref(), Some("u1"));
            assert_eq!(pruned.metadata.labels, full.metadata.labels);
        }
    }

    #[test]
    fn a_pruned_node_keeps_its_labels_and_what_vendor_plugins_report() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"gpu": "on"}, "annotations": {
                "hami.io/node-dcu-register": "DCU-0,4,16384,100,DCU,0,true:",
                "hami-vnpu-core": "true",
                "metax-tech.com/node-gpu-devices": "[]",
                "node.alpha.kubernetes.io/ttl": "0",
            }},
            "status": {"images": [{"names": ["x"], "sizeBytes": 1}],
                       "allocatable": {"hygon.com/dcunum": "4"}},
        }))
        .unwrap();
        node(&mut n);
        assert_eq!(n.metadata.labels.unwrap()["gpu"], "on");
        let annotations = n.metadata.annotations.unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            [
                "hami-vnpu-core",
                "hami.io/node-dcu-register",
                "metax-tech.com/node-gpu-devices"
            ]
        );
        let status = n.status.unwrap();
        assert!(status.images.is_none());
        assert_eq!(status.allocatable.unwrap()["hygon.com/dcunum"].0, "4");
    }
}
