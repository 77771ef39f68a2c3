//! [`LeanPod`]: a Pod as the lifecycle controllers keep every pod of the
//! cluster: read straight from the API server's Pod JSON, with only the
//! fields [`crate::lifecycle_rules`] reads decoded.
//!
//! A `k8s_openapi` Pod is about 2.2 KB before any of its strings (its
//! `PodSpec` alone 1.4 KB of mostly empty options), so a store of 45,000
//! pruned Pods held some 100 MB of empty fields, and every page of a list
//! was first decoded whole. A LeanPod is its metadata and four small fields;
//! serde skips the rest of the JSON without building it.

use k8s_openapi::{
    NamespaceResourceScope, api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{Deserialize, Deserializer, de::IgnoredAny};

/// A Pod's identity and what decides its allocation's and its lock's fate:
/// `spec.nodeName`, `status.phase`, and whether the kubelet reported any
/// container (it does so only after admission, Allocate included).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct LeanPod {
    /// The pod's metadata (name, namespace, UID, resourceVersion, deletion
    /// timestamp, owners, labels, annotations; [`prune`] keeps only the
    /// annotation a vendor's plugin answers with).
    pub metadata: ObjectMeta,
    /// What is kept of `spec`.
    #[serde(default, deserialize_with = "or_default")]
    pub spec: LeanPodSpec,
    /// What is kept of `status`.
    #[serde(default, deserialize_with = "or_default")]
    pub status: LeanPodStatus,
}

/// What is kept of a Pod's spec.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeanPodSpec {
    /// The node the pod is bound to.
    #[serde(default)]
    pub node_name: Option<String>,
}

/// What is kept of a Pod's status.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeanPodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default)]
    pub phase: Option<String>,
    /// Whether `containerStatuses` lists any container.
    #[serde(default, rename = "containerStatuses", deserialize_with = "any")]
    pub containers_reported: bool,
    /// Whether `initContainerStatuses` lists any container.
    #[serde(default, rename = "initContainerStatuses", deserialize_with = "any")]
    pub init_containers_reported: bool,
}

impl LeanPod {
    /// The node it is bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.node_name.as_deref()
    }

    /// Its phase.
    pub fn phase(&self) -> Option<&str> {
        self.status.phase.as_deref()
    }

    /// What is kept of a full Pod, built field by field: what the tests
    /// compare a pod read lean with.
    #[cfg(test)]
    pub(crate) fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let listed = |statuses: Option<&Vec<_>>| statuses.is_some_and(|s| !s.is_empty());
        Self {
            metadata: pod.metadata.clone(),
            spec: LeanPodSpec {
                node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            },
            status: LeanPodStatus {
                phase: status.and_then(|s| s.phase.clone()),
                containers_reported: listed(status.and_then(|s| s.container_statuses.as_ref())),
                init_containers_reported: listed(
                    status.and_then(|s| s.init_container_statuses.as_ref()),
                ),
            },
        }
    }
}

/// Drops what no reader of a stored pod uses from its metadata: every
/// annotation but the one a vendor's plugin answers at Allocate, the
/// finalizers, `generateName` and the managed fields.
pub fn prune(pod: &mut LeanPod) {
    let meta = &mut pod.metadata;
    meta.annotations = meta.annotations.take().and_then(|mut a| {
        let phase = a.remove(tessera_api::names::handoff::BIND_PHASE)?;
        Some([(tessera_api::names::handoff::BIND_PHASE.to_owned(), phase)].into())
    });
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.generate_name = None;
}

/// A field the API server may send as `null`: its default then.
fn or_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    deserializer: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Whether a list has any item, without building the items.
fn any<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(
        Option::<Vec<IgnoredAny>>::deserialize(deserializer)?
            .is_some_and(|items| !items.is_empty()),
    )
}

impl k8s_openapi::Resource for LeanPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = NamespaceResourceScope;
}

impl k8s_openapi::Metadata for LeanPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// A Pod's JSON as the API server sends it, with much that is not kept,
    /// and `status`.
    pub(crate) fn full(status: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "d", "uid": "u1", "resourceVersion": "7",
                         "generateName": "p-", "finalizers": ["x"],
                         "annotations": {"hami.io/bind-phase": "success", "big": "x".repeat(1000)},
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "i",
                     "env": [{"name": "A", "value": "1"}]}]},
            "status": status,
        })
    }

    #[test]
    fn reads_what_the_rules_need_from_a_pods_json_and_the_same_as_from_a_full_pod() {
        let value = full(json!({"phase": "Running", "hostIP": "10.0.0.1",
            "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": true, "restartCount": 0}]}));
        let mut lean: LeanPod = serde_json::from_value(value.clone()).unwrap();
        let pod: Pod = serde_json::from_value(value).unwrap();
        let from_full = LeanPod::of(&pod);
        for lean in [&lean, &from_full] {
            assert_eq!(lean.node_name(), Some("n1"));
            assert_eq!(lean.phase(), Some("Running"));
            assert!(lean.status.containers_reported);
            assert!(!lean.status.init_containers_reported);
            assert_eq!(lean.metadata.uid.as_deref(), Some("u1"));
        }
        prune(&mut lean);
        assert_eq!(
            lean.metadata.annotations,
            Some([("hami.io/bind-phase".to_owned(), "success".to_owned())].into())
        );
        assert!(lean.metadata.managed_fields.is_none() && lean.metadata.finalizers.is_none());
        assert!(lean.metadata.generate_name.is_none());
    }

    #[test]
    fn empty_null_and_absent_lists_and_fields_are_nothing_reported() {
        for status in [
            json!({"phase": "Pending", "containerStatuses": [], "initContainerStatuses": null}),
            json!({"phase": "Pending"}),
        ] {
            let lean: LeanPod = serde_json::from_value(full(status)).unwrap();
            assert!(!lean.status.containers_reported && !lean.status.init_containers_reported);
            assert_eq!(lean.phase(), Some("Pending"));
        }
        let bare: LeanPod = serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": null, "status": null}),
        )
        .unwrap();
        assert_eq!((bare.node_name(), bare.phase()), (None, None));
        let init: LeanPod = serde_json::from_value(full(
            json!({"initContainerStatuses": [{"name": "i", "image": "i", "imageID": "", "ready": false, "restartCount": 0}]}),
        ))
        .unwrap();
        assert!(init.status.init_containers_reported);
    }

    #[test]
    fn is_much_smaller_than_a_pod() {
        assert!(
            std::mem::size_of::<LeanPod>() * 4 < std::mem::size_of::<Pod>(),
            "LeanPod {} bytes, Pod {}",
            std::mem::size_of::<LeanPod>(),
            std::mem::size_of::<Pod>()
        );
    }
}
