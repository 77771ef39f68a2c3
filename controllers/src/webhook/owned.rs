//! Pod annotations only the scheduler (Bind) and other vendors' device
//! plugins write: a tenant who sets one at creation could make the
//! scheduler, the lifecycle controller or a vendor plugin take its pod for
//! one already placed or served (review 2026-12-01, H1: a pod created with
//! `hami.io/bind-phase: success` freed its node's lock before Allocate and
//! was served the next pod's slice). The webhook refuses them on CREATE; the
//! chart's `ValidatingAdmissionPolicy` `…-pod-owned-annotations` refuses
//! changes to them on UPDATE by anyone but the scheduler's account, service
//! accounts of trusted namespaces and cluster administrators. Both use this
//! list; `e2e/tests/owned_annotations.rs` checks that they agree.

use k8s_openapi::api::core::v1::Pod;
use tessera_api::names::{cambricon, enflame, kunlun, metax, neuron};

/// Keys Bind (or a vendor plugin answering it) writes, matched exactly.
const EXACT: &[&str] = &[
    tessera_api::names::handoff::BIND_PHASE,
    tessera_api::names::handoff::BIND_TIME,
    tessera_api::names::handoff::VGPU_NODE,
    tessera_api::names::handoff::VGPU_TIME,
    "predicate-time",
    cambricon::DSMLU_PROFILE,
    cambricon::DSMLU_ASSIGNED,
    cambricon::DSMLU_ASSIGNED_BY_PLUGIN,
    metax::ALLOCATED,
    metax::PREDICATE_TIME,
    kunlun::DEVICE_IDX,
    kunlun::ALLOCATED,
    neuron::ASSIGNED_INDEX,
    neuron::PREDICATE_NODE,
    enflame::ASSIGNED_CONTAINERS,
    enflame::REQUEST_SIZE,
];

/// Key prefixes Bind writes under (`mthreads.com/gpu-index`, `NEURON_*`,
/// `enflame.com/gcu-assigned*`).
const PREFIXES: &[&str] = &["mthreads.com/", "NEURON_", "enflame.com/gcu-assigned"];

/// Ascend's runtime information is `huawei.com/<chip>`; of that domain a
/// pod itself may set only this key.
const ASCEND_DOMAIN: &str = "huawei.com/";
const ASCEND_USER_KEYS: &[&str] = &[tessera_api::names::ascend::VNPU_MODE];

/// Whether a pod annotation is the scheduler's (or a vendor plugin's) to
/// write, never the pod's creator's.
pub fn scheduler_owned(key: &str) -> bool {
    if EXACT.contains(&key) || PREFIXES.iter().any(|p| key.starts_with(p)) {
        return true;
    }
    if let Some(rest) = key.strip_prefix("hami.io/") {
        // `hami.io/<type>-devices-to-allocate`, `…-devices-allocated`,
        // `hami.io/kunlun-allocated` (HAMi's `InRequestDevices`,
        // `SupportDevices`): every device hand-off Bind writes.
        return rest.ends_with("-devices-to-allocate") || rest.ends_with("-allocated");
    }
    key.starts_with(ASCEND_DOMAIN) && !ASCEND_USER_KEYS.contains(&key)
}

/// The refusal for a pod created with a scheduler-owned annotation, naming
/// the first one.
pub fn refusal(pod: &Pod) -> Option<String> {
    let key = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .find(|k| scheduler_owned(k))?;
    Some(format!(
        "metadata.annotations[{key:?}]: this annotation is written by the scheduler when it binds the pod (or by a device plugin serving it), never by the pod's creator; remove it"
    ))
}

/// Keys the tests hold both the webhook and the chart's policy to: every
/// key Bind writes must be refused, every key a user writes admitted.
pub const EXAMPLES_OWNED: &[&str] = &[
    "hami.io/bind-phase",
    "hami.io/bind-time",
    "hami.io/vgpu-node",
    "hami.io/vgpu-time",
    "hami.io/dcu-devices-to-allocate",
    "hami.io/dcu-devices-allocated",
    "hami.io/Ascend910B4-devices-to-allocate",
    "hami.io/kunlun-allocated",
    "hami.io/aws-neuron-devices-allocated",
    "hami.io/enflame-vgpu-devices-allocated",
    "huawei.com/Ascend910B4",
    "predicate-time",
    "CAMBRICON_DSMLU_PROFILE",
    "CAMBRICON_DSMLU_ASSIGNED",
    "CAMBRICON_DSMLU_ASSIGHED",
    "mthreads.com/gpu-index",
    "mthreads.com/predicate-node",
    "metax-tech.com/gpu-devices-allocated",
    "metax-tech.com/predicate-time",
    "BAIDU_COM_DEVICE_IDX",
    "AWS_NEURON_IDS",
    "NEURON_ALLOCATED",
    "aws.amazon.com/predicate-node",
    "enflame.com/gcu-assigned",
    "enflame.com/gcu-request-size",
    "assigned-containers",
];

/// Keys a pod's creator writes (HAMi's pod API and common tools).
pub const EXAMPLES_USER: &[&str] = &[
    "nvidia.com/use-gputype",
    "nvidia.com/nouse-gpuuuid",
    "nvidia.com/vgpu-mode",
    "hami.io/gpu-scheduler-policy",
    "hami.io/node-scheduler-policy",
    "hami.io/device-scoring-weights",
    "hami.io/use-xpu-uuid",
    "hami.io/no-use-xpu-uuid",
    "huawei.com/vnpu-mode",
    "hygon.com/use-dcutype",
    "metax-tech.com/sgpu-qos-policy",
    "enflame.com/use-gpuuuid",
    "aws.amazon.com/use-neuron-uuid",
    "mthreads.ai/use-gpuuuid",
    "tessera.dev/traceparent",
    "kubectl.kubernetes.io/last-applied-configuration",
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tessera_api::names::mthreads;

    use super::*;

    #[test]
    fn every_key_bind_writes_is_owned_and_no_user_key_is() {
        for key in EXAMPLES_OWNED {
            assert!(scheduler_owned(key), "{key} should be the scheduler's");
        }
        for key in EXAMPLES_USER {
            assert!(!scheduler_owned(key), "{key} is the user's");
        }
        for key in [
            mthreads::GPU_INDEX,
            mthreads::PREDICATE_NODE,
            mthreads::PREDICATE_TIME,
            mthreads::REQUEST_GPU_NUM,
            neuron::ALLOCATED,
            neuron::ALLOCATED_FLAG,
            neuron::PREDICATE_TIME,
            neuron::RESOURCE_TYPE,
            enflame::ASSIGNED,
            enflame::ASSIGNED_TIME,
            enflame::ASSIGNED_INDEX,
            enflame::ASSIGNED_ID,
            enflame::ASSIGNED_MINOR,
            enflame::DRS_ALLOCATED,
        ] {
            assert!(scheduler_owned(key), "{key}");
        }
    }

    #[test]
    fn a_pod_created_with_an_owned_annotation_is_refused_naming_it() {
        let mut pod = Pod::default();
        assert_eq!(refusal(&pod), None);
        pod.metadata.annotations = Some(BTreeMap::from([
            (
                "hami.io/gpu-scheduler-policy".to_owned(),
                "binpack".to_owned(),
            ),
            ("hami.io/bind-phase".to_owned(), "success".to_owned()),
        ]));
        let message = refusal(&pod).unwrap();
        assert!(
            message.starts_with("metadata.annotations[\"hami.io/bind-phase\"]"),
            "{message}"
        );
    }
}
