//! The CustomResourceDefinitions generated from [`crate::v1alpha1`].
//!
//! `crds/*.yaml` in the repository is the output of [`render`], written by the
//! `tessera-crdgen` binary (`make crds`); a test fails when it is stale.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::v1alpha1::{GpuNode, GpuNodeConfig, NodeLock, VgpuAllocation};
use crate::{Error, Result};

/// The header of every generated file.
pub const HEADER: &str = "# Generated from api/src/v1alpha1 by `make crds`. Do not edit.\n";

/// Every Tessera CRD.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        GpuNode::crd(),
        vgpu_allocation(),
        NodeLock::crd(),
        GpuNodeConfig::crd(),
    ]
}

/// VgpuAllocation's CRD, its `status` defaulted to `{phase: Bound}`.
///
/// Bind creates the allocation just before it binds the pod, and a create
/// cannot carry a status (the status subresource drops it). The API server
/// applies a schema's defaults whenever it reads an object from etcd (gets,
/// lists and watches), so an allocation nobody has written a status for yet
/// reads as `Bound`, `kubectl get vgpuallocations` shows it so, and Bind
/// needs no second write to say it. The first status write (the agent's
/// `Allocated`, the lifecycle's `Released`) replaces the default.
fn vgpu_allocation() -> CustomResourceDefinition {
    let mut crd = VgpuAllocation::crd();
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"));
        if let Some(status) = status {
            status.default = Some(
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON(
                    serde_json::json!({"phase": "Bound"}),
                ),
            );
        }
    }
    crd
}

/// A generated CRD file: its name under `crds/` and its contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdFile {
    /// File name, `<plural>.<group>.yaml`.
    pub name: String,
    /// YAML text, starting with [`HEADER`].
    pub contents: String,
}

/// Renders every CRD as the files under `crds/`.
pub fn render() -> Result<Vec<CrdFile>> {
    all()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_yaml_ng::to_string(&crd).map_err(|source| Error::RenderCrd {
                name: name.clone(),
                source,
            })?;
            Ok(CrdFile {
                name: format!("{name}.yaml"),
                contents: format!("{HEADER}{yaml}"),
            })
        })
        .collect()
}
