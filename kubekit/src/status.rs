//! Status writes by server-side apply, one field manager per component: the
//! status is built as a typed value, so a renamed field fails to compile
//! instead of silently writing nothing.
//!
//! Server-side apply is not a merge patch, and callers must write for it:
//!
//! - a field this manager applied before and leaves out now is removed
//!   (unless another manager owns it too), so each apply carries every
//!   status field the component means to keep;
//! - lists merge as the CRD's `x-kubernetes-list-type` says: an atomic list
//!   (the default) is replaced whole, a `map` list (conditions by `type`,
//!   devices by `uuid`) merges entry by entry, so applying one condition
//!   leaves the others, and their owners, alone;
//! - every apply is forced: a status field is the writing component's to
//!   decide (an allocation's phase passes between the controller and the
//!   node agent), and fields written earlier by merge patch belong to
//!   another manager, whose ownership the first apply takes over.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
    core::object::HasStatus,
};
use serde::{Serialize, de::DeserializeOwned};

/// Writes objects' status by server-side apply as one field manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusWriter {
    field_manager: &'static str,
}

impl StatusWriter {
    /// Applies as `field_manager` (one name per component, e.g.
    /// `tessera-controller`).
    pub const fn new(field_manager: &'static str) -> Self {
        Self { field_manager }
    }

    /// The field manager it applies as.
    pub const fn field_manager(&self) -> &'static str {
        self.field_manager
    }

    /// Applies `status` to the object `name`, whatever its version.
    pub async fn apply<K>(
        &self,
        api: &Api<K>,
        name: &str,
        status: &K::Status,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
        K::Status: Serialize + std::fmt::Debug,
    {
        self.apply_at(api, name, None, status).await
    }

    /// Applies `status` to the object `name` only while it is still at
    /// `resource_version` (when given): else the API server answers 409
    /// Conflict and nothing is written.
    pub async fn apply_at<K>(
        &self,
        api: &Api<K>,
        name: &str,
        resource_version: Option<&str>,
        status: &K::Status,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
        K::Status: Serialize + std::fmt::Debug,
    {
        let params = PatchParams::apply(self.field_manager).force();
        let intent = intent::<K, _>(name, resource_version, status);
        api.patch_status(name, &params, &Patch::Apply(&intent))
            .await
    }
}

/// The body of a status apply: the object's identity and the status.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Intent<'a, S> {
    api_version: Cow<'static, str>,
    kind: Cow<'static, str>,
    metadata: ObjectMeta,
    status: &'a S,
}

fn intent<'a, K, S>(name: &str, resource_version: Option<&str>, status: &'a S) -> Intent<'a, S>
where
    K: Resource<DynamicType = ()>,
{
    Intent {
        api_version: K::api_version(&()),
        kind: K::kind(&()),
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: resource_version.map(str::to_owned),
            ..ObjectMeta::default()
        },
        status,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;

    #[test]
    fn an_apply_names_the_object_and_carries_only_the_status() {
        let status = json!({"phase": "Released"});
        let body = serde_json::to_value(intent::<Pod, _>("p", None, &status)).unwrap();
        assert_eq!(
            body,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": {"phase": "Released"}})
        );
        let guarded = serde_json::to_value(intent::<Pod, _>("p", Some("42"), &status)).unwrap();
        assert_eq!(
            guarded["metadata"],
            json!({"name": "p", "resourceVersion": "42"})
        );
    }
}
