//! The VgpuAllocation that mirrors a prepared claim, so the one ledger
//! (`kubectl get vgpuallocations`, the metrics, the scheduler's invariants)
//! shows every holder whichever door it came through. Pure: no I/O.

use k8s_openapi::{
    api::resource::v1::ResourceClaim,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::Resource;
use tessera_api::v1alpha1::{
    AllocationTotals, ClaimReference, ContainerAllocation, DeviceSlice, VgpuAllocation,
    VgpuAllocationSpec,
};

use super::prepare::{ClaimGpu, by_request, claim_error, merged};
use crate::Error;

/// The mirror of claim `uid`'s name: `claim-<UID>` (claim names may equal
/// pod names, whose allocations share the namespace).
pub fn mirror_name(uid: &str) -> String {
    format!("claim-{uid}")
}

/// The mirror of `claim`, prepared on `node` with `gpus`: named
/// [`mirror_name`], owned by the claim (the garbage collector removes it
/// with the claim), for the first pod the claim is reserved for, with one
/// container entry per request. Two results of one request on the same GPU
/// (a request for two shares of one device) make one slice of their sum.
pub fn mirror(
    claim: &ResourceClaim,
    node: &str,
    gpus: &[ClaimGpu],
) -> Result<VgpuAllocation, Error> {
    let uid = claim
        .metadata
        .uid
        .clone()
        .ok_or_else(|| claim_error(claim, "has no UID"))?;
    let name = claim.metadata.name.clone().unwrap_or_default();
    let pod = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .and_then(|r| {
            r.iter().find(|c| {
                c.resource == "pods" && c.api_group.as_deref().unwrap_or_default().is_empty()
            })
        })
        .ok_or_else(|| claim_error(claim, "is reserved for no pod (status.reservedFor)"))?;
    let containers: Vec<ContainerAllocation> = by_request(gpus)
        .into_iter()
        .map(|(request, gpus)| {
            let devices = merged(&gpus)
                .into_iter()
                .map(|gpu| DeviceSlice {
                    mutex: false,
                    core_indexes: Vec::new(),
                    family: Default::default(),
                    template: None,
                    uuid: gpu.uuid,
                    index: gpu.index,
                    model: gpu.model,
                    memory_mib: gpu.memory_mib,
                    cores: gpu.cores,
                    mig: None,
                    sharing: None,
                })
                .collect();
            ContainerAllocation {
                name: request.to_owned(),
                devices,
                priority: None,
            }
        })
        .collect();
    Ok(VgpuAllocation {
        metadata: ObjectMeta {
            name: Some(mirror_name(&uid)),
            namespace: claim.metadata.namespace.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: ResourceClaim::api_version(&()).into_owned(),
                kind: ResourceClaim::kind(&()).into_owned(),
                name: name.clone(),
                uid: uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: VgpuAllocationSpec {
            quota: Default::default(),
            pod_name: pod.name.clone(),
            pod_uid: pod.uid.clone(),
            node_name: node.to_owned(),
            totals: AllocationTotals::of(&containers),
            containers,
            gpu_policy: None,
            node_policy: None,
            claim: Some(ClaimReference { name, uid }),
            trace_context: None,
            priority: None,
            nomination: None,
        },
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{ResourceClaimConsumerReference, ResourceClaimStatus};
    use pretty_assertions::assert_eq;

    use super::*;
    use crate::dra::prepare::tests::claimed as gpu;

    fn claim(reserved: Vec<ResourceClaimConsumerReference>) -> ResourceClaim {
        let mut claim = ResourceClaim::default();
        claim.metadata.namespace = Some("ml".into());
        claim.metadata.name = Some("train-gpu-x7k2".into());
        claim.metadata.uid = Some("c-1".into());
        claim.status = Some(ResourceClaimStatus {
            reserved_for: Some(reserved),
            ..ResourceClaimStatus::default()
        });
        claim
    }

    fn pod(name: &str, uid: &str) -> ResourceClaimConsumerReference {
        ResourceClaimConsumerReference {
            resource: "pods".into(),
            name: name.into(),
            uid: uid.into(),
            api_group: None,
        }
    }

    #[test]
    fn a_mirror_has_one_entry_per_request_owned_by_the_claim() {
        let gpus = [
            gpu("gpu", 1, 8192, 30),
            gpu("pair", 0, 4096, 0),
            gpu("pair", 2, 4096, 0),
            gpu("gpu", 1, 1024, 80),
        ];
        let mirror = mirror(&claim(vec![pod("train", "p-1")]), "node-a", &gpus).unwrap();
        assert_eq!(mirror.metadata.name.as_deref(), Some("claim-c-1"));
        assert_eq!(mirror.metadata.namespace.as_deref(), Some("ml"));
        let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.uid.as_str()
            ),
            ("resource.k8s.io/v1", "ResourceClaim", "c-1")
        );
        let spec = &mirror.spec;
        assert_eq!(
            (spec.pod_name.as_str(), spec.pod_uid.as_str()),
            ("train", "p-1")
        );
        assert_eq!(spec.claim.as_ref().unwrap().name, "train-gpu-x7k2");
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(spec.containers[0].name, "gpu");
        // Two shares of GPU-1 in one request: one slice of their sum.
        assert_eq!(spec.containers[0].devices.len(), 1);
        assert_eq!(spec.containers[0].devices[0].memory_mib, 9216);
        assert_eq!(spec.containers[0].devices[0].cores, 100);
        assert_eq!(spec.containers[1].devices.len(), 2);
        assert_eq!(spec.totals.memory_mib, 9216 + 8192);
        assert_eq!(spec.totals.devices, "GPU-1,GPU-0,GPU-2");
        assert_eq!(mirror.region_name("gpu"), "c-1_gpu");
        assert_eq!(
            mirror.region_name("gpu"),
            super::super::prepare::region_name("c-1", "gpu")
        );
    }

    #[test]
    fn a_claim_reserved_for_no_pod_has_no_mirror() {
        let mut for_a_controller = pod("set", "s-1");
        for_a_controller.api_group = Some("apps".into());
        let error = mirror(
            &claim(vec![for_a_controller]),
            "node-a",
            &[gpu("gpu", 0, 1, 0)],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("ml/train-gpu-x7k2: is reserved for no pod"),
            "{error}"
        );
    }
}
