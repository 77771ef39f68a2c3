//! HAMi's admission writes (each vendor's `MutateAdmission`), family by
//! family.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::json;

use crate::request::{ContainerRequest, RequestConfig, parse_pod};

/// What the webhook writes for `wanted`'s family in `container`.
fn vendor_limits(container: &mut Container, wanted: &ContainerRequest, config: &RequestConfig) {
    config
        .families()
        .admit_container(container, std::slice::from_ref(wanted));
}

/// What the webhook writes on the pod, every family enabled.
fn pod_annotations(pod: &mut Pod, wanted: &[ContainerRequest]) {
    crate::request::vendor_config()
        .families()
        .admit_pod(pod, wanted);
}

/// What the webhook writes on the pod under `config`.
fn ascend_runtime(pod: &mut Pod, wanted: &[ContainerRequest], config: &RequestConfig) {
    config.families().admit_pod(pod, wanted);
}

fn mutated(limits: serde_json::Value) -> Container {
    let config = crate::request::vendor_config();
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
    let one = mutated(json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vCore": "30"}));
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
    let again: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [two]}}))
            .unwrap();
    let reparsed = parse_pod(&again, &crate::request::vendor_config())
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
    let config = crate::request::vendor_config();
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
    let mut config = crate::request::vendor_config();
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
    let trimmed = mutated(json!({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "30000"}));
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
    let config = crate::request::vendor_config();
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
