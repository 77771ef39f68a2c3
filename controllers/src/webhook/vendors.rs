//! What the webhook writes for other vendors' containers, as HAMi's
//! webhook does (each vendor's `MutateAdmission`): Ascend's memory rounded
//! to its template and 910C pairs; Iluvatar's whole-GPU cores and container
//! name; Moore Threads' whole cards; Kunlunxin's vXPU sizes. Other vendors'
//! containers are left as they are.

use k8s_openapi::{
    api::core::v1::{Container, EnvVar},
    apimachinery::pkg::api::resource::Quantity,
};
use tessera_api::{names::iluvatar::CONTAINER_NAME_ENV, v1alpha1::DeviceFamily};
use tessera_scheduling::request::{ContainerRequest, RequestConfig};

/// Writes what HAMi's webhook writes for an Ascend container
/// (`MutateAdmission`): its memory rounded up to the vNPU template (or the
/// whole card), and a 910C count of 1 raised to the module pair, in limits
/// and, where present, requests, so the kubelet accounts what the plugin
/// hands out. Other vendors' containers are left as they are (HAMi's
/// webhook changes nothing for them).
pub(super) fn vendor_limits(
    container: &mut Container,
    wanted: &ContainerRequest,
    config: &RequestConfig,
) {
    if wanted.family == DeviceFamily::Iluvatar {
        iluvatar_limits(container, wanted, config);
        return;
    }
    if wanted.family == DeviceFamily::Mthreads {
        mthreads_limits(container, wanted, config);
        return;
    }
    if wanted.family == DeviceFamily::Kunlunxin {
        vxpu_limits(container, wanted, config);
        return;
    }
    let Some(chip) = wanted
        .vendor
        .as_ref()
        .and_then(|v| v.device_type.as_deref())
        .and_then(|t| {
            config
                .vnpus
                .iter()
                .flat_map(|v| &v.configs)
                .find(|c| c.common_word == t)
        })
    else {
        return;
    };
    let memory = wanted.memory.resolve(0) / u64::from(chip.memory_factor.max(1));
    let resources = container.resources.get_or_insert_default();
    for (key, value) in [
        (&chip.resource_name, wanted.count.to_string()),
        (&chip.resource_memory_name, memory.to_string()),
    ] {
        resources
            .limits
            .get_or_insert_default()
            .insert(key.clone(), Quantity(value.clone()));
        if let Some(requests) = resources.requests.as_mut() {
            requests.insert(key.clone(), Quantity(value));
        }
    }
}

/// What HAMi's webhook writes for a Moore Threads container that asks for
/// whole cards (more than one, or no memory): 16 cores and 96 memory units
/// per card.
fn mthreads_limits(container: &mut Container, wanted: &ContainerRequest, config: &RequestConfig) {
    use tessera_api::names::mthreads::{CORES_PER_CARD, WHOLE_CARD_UNITS};
    let Some(mt) = &config.mthreads else {
        return;
    };
    let resources = container.resources.get_or_insert_default();
    let named = |key: &str| {
        resources
            .limits
            .as_ref()
            .is_some_and(|l| l.contains_key(key))
            || resources
                .requests
                .as_ref()
                .is_some_and(|r| r.contains_key(key))
    };
    if wanted.count == 1 && named(&mt.resource_memory_name) {
        return;
    }
    let count = u64::from(wanted.count);
    let limits = resources.limits.get_or_insert_default();
    limits.insert(
        mt.resource_core_name.clone(),
        Quantity((count * u64::from(CORES_PER_CARD)).to_string()),
    );
    limits.insert(
        mt.resource_memory_name.clone(),
        Quantity((count * WHOLE_CARD_UNITS).to_string()),
    );
}

/// What HAMi's webhook writes for a Kunlunxin vXPU container that names
/// its memory (`MutateAdmission` in `vdevice.go`): the memory rounded up to
/// the vXPU size, in limits and requests, so the kubelet accounts what the
/// plugin hands out.
fn vxpu_limits(container: &mut Container, wanted: &ContainerRequest, config: &RequestConfig) {
    use tessera_api::names::kunlun::VXPU_TYPE;
    let Some(xpu) = &config.kunlun else {
        return;
    };
    let vxpu = wanted
        .vendor
        .as_ref()
        .and_then(|v| v.device_type.as_deref())
        == Some(VXPU_TYPE);
    let resources = container.resources.get_or_insert_default();
    let key = &xpu.resource_vmemory_name;
    let named = resources
        .limits
        .as_ref()
        .is_some_and(|l| l.contains_key(key));
    if !vxpu || !named {
        return;
    }
    let size = Quantity(wanted.memory.resolve(0).to_string());
    resources
        .limits
        .get_or_insert_default()
        .insert(key.clone(), size.clone());
    resources
        .requests
        .get_or_insert_default()
        .insert(key.clone(), size);
}

/// What HAMi's Ascend `MutateAdmission` writes beyond the limits: a chip's
/// `runtimeClassName` on a pod asking for that chip's NPUs that names no
/// RuntimeClass, and, for a chip with `overwriteEnv`, an empty
/// `ASCEND_VISIBLE_DEVICES` in every container that asks for no Ascend NPU
/// (so Ascend's runtime hands it none) unless the container sets it.
pub(super) fn ascend_runtime(
    pod: &mut k8s_openapi::api::core::v1::Pod,
    wanted: &[ContainerRequest],
    config: &RequestConfig,
) {
    use tessera_api::names::ascend::VISIBLE_DEVICES;
    let chips = config.vnpus.iter().flat_map(|v| &v.configs);
    let asks_chip = |chip: &str| {
        wanted.iter().any(|r| {
            r.family == DeviceFamily::Ascend
                && r.vendor.as_ref().and_then(|v| v.device_type.as_deref()) == Some(chip)
        })
    };
    let spec = pod.spec.get_or_insert_default();
    if spec.runtime_class_name.is_none()
        && let Some(chip) = chips
            .clone()
            .find(|c| !c.runtime_class_name.is_empty() && asks_chip(&c.common_word))
    {
        spec.runtime_class_name = Some(chip.runtime_class_name.clone());
    }
    if !chips.clone().any(|c| c.overwrite_env) {
        return;
    }
    let asks_npus = |name: &str| {
        wanted
            .iter()
            .any(|r| r.name == name && r.family == DeviceFamily::Ascend)
    };
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for container in containers {
        if asks_npus(&container.name) {
            continue;
        }
        let env = container.env.get_or_insert_default();
        if !env.iter().any(|e| e.name == VISIBLE_DEVICES) {
            env.push(EnvVar {
                name: VISIBLE_DEVICES.into(),
                value: Some(String::new()),
                value_from: None,
            });
        }
    }
}

/// The pod annotations HAMi's webhook adds for other vendors: Moore
/// Threads' `mthreads.com/request-gpu-num` for a container asking for more
/// than one GPU, MetaX's `metax-tech.com/sgpu-qos-policy: best-effort` for
/// an sGPU pod that is not online and names no policy.
pub(super) fn pod_annotations(
    pod: &mut k8s_openapi::api::core::v1::Pod,
    wanted: &[ContainerRequest],
) {
    use tessera_api::names::metax;
    let sgpu = wanted.iter().any(|r| {
        r.family == DeviceFamily::Metax
            && r.vendor.as_ref().and_then(|v| v.device_type.as_deref()) == Some(metax::SGPU_TYPE)
    });
    // MetaX's sGPU plugin reads the QoS policy; HAMi's webhook writes
    // best-effort for a pod that is not online and names none.
    let named = |key: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(key));
    if sgpu
        && named(metax::APP_CLASS).map(String::as_str) != Some("online")
        && named(metax::QOS_POLICY).is_none()
    {
        pod.metadata
            .annotations
            .get_or_insert_default()
            .insert(metax::QOS_POLICY.to_owned(), "best-effort".to_owned());
    }
    if let Some(many) = wanted
        .iter()
        .find(|r| r.family == DeviceFamily::Mthreads && r.count > 1)
    {
        pod.metadata.annotations.get_or_insert_default().insert(
            tessera_api::names::mthreads::REQUEST_GPU_NUM.to_owned(),
            many.count.to_string(),
        );
    }
}

/// What HAMi's webhook writes for an Iluvatar container: 100 × count cores
/// when it asks for more than one GPU, and the container's name in
/// `SOL_CONTINER_NAME` (read by the vendor's runtime) unless it sets it.
fn iluvatar_limits(container: &mut Container, wanted: &ContainerRequest, config: &RequestConfig) {
    let chip = wanted
        .vendor
        .as_ref()
        .and_then(|v| v.device_type.as_deref())
        .and_then(|t| config.iluvatars.iter().find(|c| c.common_word == t));
    if let Some(chip) = chip
        && wanted.count > 1
        && !chip.resource_core_name.is_empty()
    {
        let cores = Quantity((100 * u64::from(wanted.count)).to_string());
        let resources = container.resources.get_or_insert_default();
        resources
            .limits
            .get_or_insert_default()
            .insert(chip.resource_core_name.clone(), cores.clone());
        if let Some(requests) = resources.requests.as_mut() {
            requests.insert(chip.resource_core_name.clone(), cores);
        }
    }
    let env = container.env.get_or_insert_default();
    if !env.iter().any(|e| e.name == CONTAINER_NAME_ENV) {
        env.push(EnvVar {
            name: CONTAINER_NAME_ENV.into(),
            value: Some(container.name.clone()),
            value_from: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;
    use tessera_scheduling::request::parse_pod;

    use super::*;

    fn mutated(limits: serde_json::Value) -> Container {
        let config = tessera_scheduling::request::vendor_config();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        }))
        .unwrap();
        let request = parse_pod(&pod, &config).unwrap().unwrap();
        let mut container = pod.spec.unwrap().containers.remove(0);
        for wanted in &request.containers {
            vendor_limits(&mut container, wanted, &config);
        }
        container
    }

    fn limit(container: &Container, key: &str) -> Option<String> {
        container
            .resources
            .as_ref()?
            .limits
            .as_ref()?
            .get(key)
            .map(|q| q.0.clone())
    }

    #[test]
    fn ascend_memory_is_written_as_the_template_and_910c_as_a_pair() {
        let vnpu =
            mutated(json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "3000"}));
        assert_eq!(
            limit(&vnpu, "huawei.com/Ascend910A-memory").as_deref(),
            Some("4369")
        );
        let pair = mutated(json!({"huawei.com/Ascend910C": "1"}));
        assert_eq!(limit(&pair, "huawei.com/Ascend910C").as_deref(), Some("2"));
        assert_eq!(
            limit(&pair, "huawei.com/Ascend910C-memory").as_deref(),
            Some("65536")
        );
    }

    #[test]
    fn iluvatar_containers_get_whole_gpu_cores_and_their_name() {
        let two = mutated(json!({"iluvatar.ai/MR-V100-vgpu": "2"}));
        assert_eq!(
            limit(&two, "iluvatar.ai/MR-V100.vCore").as_deref(),
            Some("200")
        );
        let env = two.env.unwrap_or_default();
        assert!(
            env.iter()
                .any(|e| e.name == "SOL_CONTINER_NAME" && e.value.as_deref() == Some("main"))
        );
        let one =
            mutated(json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vCore": "30"}));
        assert_eq!(
            limit(&one, "iluvatar.ai/MR-V100.vCore").as_deref(),
            Some("30"),
            "left as asked"
        );
    }

    #[test]
    fn moore_threads_whole_cards_get_their_cores_and_memory_written() {
        let two = mutated(json!({"mthreads.com/vgpu": "2"}));
        assert_eq!(limit(&two, "mthreads.com/sgpu-core").as_deref(), Some("32"));
        assert_eq!(
            limit(&two, "mthreads.com/sgpu-memory").as_deref(),
            Some("192")
        );
        // The mutated pod is what Filter and Bind parse: it must still ask
        // for two whole cards.
        let again: Pod = serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [two]}}),
        )
        .unwrap();
        let reparsed = parse_pod(&again, &tessera_scheduling::request::vendor_config())
            .unwrap()
            .unwrap();
        assert_eq!(
            (reparsed.containers[0].count, reparsed.containers[0].cores),
            (2, 16)
        );
        let slice = mutated(
            json!({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "4"}),
        );
        assert_eq!(
            limit(&slice, "mthreads.com/sgpu-memory").as_deref(),
            Some("8"),
            "left as asked"
        );
        let mut pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        let config = tessera_scheduling::request::vendor_config();
        let wanted = parse_pod(
            &serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "resources": {"limits": {"mthreads.com/vgpu": "2"}}}]}})).unwrap(),
            &config,
        )
        .unwrap()
        .unwrap();
        pod_annotations(&mut pod, &wanted.containers);
        assert_eq!(
            pod.metadata.annotations.unwrap()["mthreads.com/request-gpu-num"],
            "2"
        );
    }

    #[test]
    fn ascend_pods_get_the_runtime_class_and_other_containers_no_npus() {
        // HAMi's Ascend MutateAdmission: runtimeClassName when the pod names
        // none; overwriteEnv empties ASCEND_VISIBLE_DEVICES elsewhere.
        let mut config = tessera_scheduling::request::vendor_config();
        let chip = &mut config.vnpus.as_mut().unwrap().configs[0];
        chip.runtime_class_name = "ascend".into();
        chip.overwrite_env = true;
        let mutate = |runtime: Option<&str>| {
            let mut pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p"},
                "spec": {
                    "runtimeClassName": runtime,
                    "containers": [
                        {"name": "npu", "resources": {"limits": {"huawei.com/Ascend910A": "1"}}},
                        {"name": "sidecar"},
                        {"name": "own", "env": [{"name": "ASCEND_VISIBLE_DEVICES", "value": "0"}]},
                    ],
                },
            }))
            .unwrap();
            let wanted = parse_pod(&pod, &config).unwrap().unwrap();
            ascend_runtime(&mut pod, &wanted.containers, &config);
            pod.spec.unwrap()
        };
        let spec = mutate(None);
        assert_eq!(spec.runtime_class_name.as_deref(), Some("ascend"));
        let env = |i: usize| {
            spec.containers[i]
                .env
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e.name == "ASCEND_VISIBLE_DEVICES")
                .map(|e| e.value.unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            env(0),
            Vec::<String>::new(),
            "the NPU container keeps what the plugin gives"
        );
        assert_eq!(env(1), [""]);
        assert_eq!(env(2), ["0"], "a container's own value is kept");
        assert_eq!(
            mutate(Some("mine")).runtime_class_name.as_deref(),
            Some("mine"),
            "a pod's own RuntimeClass is kept"
        );
    }

    #[test]
    fn kunlunxin_vxpu_memory_is_written_as_its_size() {
        // HAMi's TestKunlunVDevices_MutateAdmission: limits and requests.
        let trimmed =
            mutated(json!({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "30000"}));
        assert_eq!(
            limit(&trimmed, "kunlunxin.com/vxpu-memory").as_deref(),
            Some("49152")
        );
        let requests = trimmed
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap();
        assert_eq!(requests["kunlunxin.com/vxpu-memory"].0, "49152");
        let whole = mutated(json!({"kunlunxin.com/vxpu": "1"}));
        assert_eq!(
            limit(&whole, "kunlunxin.com/vxpu-memory"),
            None,
            "left as asked"
        );
    }

    #[test]
    fn metax_sgpu_pods_get_best_effort_unless_online_or_named() {
        let config = tessera_scheduling::request::vendor_config();
        let annotated = |limits: serde_json::Value, annotations: serde_json::Value| {
            let mut pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "annotations": annotations},
                "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
            }))
            .unwrap();
            let wanted = parse_pod(&pod, &config).unwrap().unwrap();
            pod_annotations(&mut pod, &wanted.containers);
            pod.metadata.annotations.unwrap_or_default()
        };
        let qos = "metax-tech.com/sgpu-qos-policy";
        // HAMi's TestMutateAdmission: "no qos policy", "pod annotation nil".
        let plain = annotated(json!({"metax-tech.com/sgpu": "1"}), json!(null));
        assert_eq!(plain[qos], "best-effort");
        let offline = annotated(
            json!({"metax-tech.com/sgpu": "1"}),
            json!({"metax-tech.com/sgpu-app-class": "offline"}),
        );
        assert_eq!(offline[qos], "best-effort");
        // "qos policy fit": kept; "online task with qos": not written.
        let named = annotated(
            json!({"metax-tech.com/sgpu": "1"}),
            json!({qos: "fixed-share"}),
        );
        assert_eq!(named[qos], "fixed-share");
        let online = annotated(
            json!({"metax-tech.com/sgpu": "1"}),
            json!({"metax-tech.com/sgpu-app-class": "online"}),
        );
        assert!(!online.contains_key(qos));
        // "no sgpu resource": whole GPUs get no policy.
        assert!(!annotated(json!({"metax-tech.com/gpu": "1"}), json!(null)).contains_key(qos));
    }

    #[test]
    fn hygon_containers_are_left_as_they_are() {
        let dcu = mutated(json!({"hygon.com/dcunum": "1"}));
        assert_eq!(limit(&dcu, "hygon.com/dcucores"), None);
        assert!(dcu.env.is_none());
    }
}
