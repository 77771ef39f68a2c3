//! What the lifecycle controllers keep of the Nodes they watch: only the
//! fields the configs controller and the vendor views read. (Pods are read
//! lean to begin with: [`crate::lean_pod`].)

use k8s_openapi::api::core::v1::Node;

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
