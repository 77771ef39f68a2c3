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
//!   another manager, whose ownership the first apply takes over;
//! - a `resourceVersion` in the apply is a precondition, as in an update:
//!   [`StatusWriter::apply_at`] writes only over the version it read.
//!
//! A status type whose fields are not all optional (counts, summaries)
//! cannot say "this write sets only the conditions" by leaving the rest
//! unset; [`StatusWriter::apply_part_at`] sends only the fields that differ
//! from the type's default, so a partial write claims nothing else.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
    core::object::HasStatus,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Map, Value};

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

    /// Applies `status` to the object `name`: whatever its version with
    /// `resource_version` `None`, else only while it is still at that
    /// version (otherwise the API server answers 409 Conflict and nothing
    /// is written).
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
        self.send(api, name, resource_version, status).await
    }

    /// Like [`StatusWriter::apply_at`], sending only the status fields
    /// (top-level) that differ from `K::Status::default()`: for a write
    /// that deliberately sets a part of the status (one condition) and must
    /// neither claim nor overwrite the rest.
    pub async fn apply_part_at<K>(
        &self,
        api: &Api<K>,
        name: &str,
        resource_version: Option<&str>,
        status: &K::Status,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
        K::Status: Serialize + Default,
    {
        let part = part(status).map_err(kube::Error::SerdeError)?;
        self.send(api, name, resource_version, &part).await
    }

    async fn send<K, S>(
        &self,
        api: &Api<K>,
        name: &str,
        resource_version: Option<&str>,
        status: &S,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
        S: Serialize + std::fmt::Debug,
    {
        let params = PatchParams::apply(self.field_manager).force();
        let intent = intent::<K, _>(name, resource_version, status);
        api.patch_status(name, &params, &Patch::Apply(&intent))
            .await
    }
}

/// The top-level fields of `status` that differ from the default's.
fn part<S: Serialize + Default>(status: &S) -> Result<Map<String, Value>, serde_json::Error> {
    let fields = |value: Value| match value {
        Value::Object(fields) => fields,
        _ => Map::new(),
    };
    let defaults = fields(serde_json::to_value(S::default())?);
    let mut set = fields(serde_json::to_value(status)?);
    set.retain(|name, value| defaults.get(name) != Some(value));
    Ok(set)
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

    #[derive(Debug, Default, Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Summary {
        count: u32,
        model: String,
        conditions: Vec<String>,
    }

    #[test]
    fn a_part_is_the_fields_set_away_from_their_defaults() {
        let ready = Summary {
            conditions: vec!["Ready".to_owned()],
            ..Summary::default()
        };
        assert_eq!(
            Value::Object(part(&ready).unwrap()),
            json!({"conditions": ["Ready"]})
        );
        let counted = Summary {
            count: 2,
            ..Summary::default()
        };
        assert_eq!(Value::Object(part(&counted).unwrap()), json!({"count": 2}));
    }
}
