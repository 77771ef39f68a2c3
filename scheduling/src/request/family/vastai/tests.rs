//! HAMi's Vastai cases (`pkg/device/vastai/device_test.go`): the request
//! (`Test_GenerateResourceRequests`) and the hand-off
//! (`Test_PatchAnnotations`). The placement (`TestDevices_Fit`, die mode
//! included, `TestComputeBestCombination`) and the node score
//! (`ScoreNode`) are the engine's: `engine/counted_tests.rs`.

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tessera_api::{
    names::handoff::MUTEX_LOCK,
    testing::{allocation, container},
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use crate::request::vendor_tests::pod;
use crate::request::{Binding, MemoryRequest, parse_pod, vendor_config};

const VA: &str = "vastaitech.com/va";

#[test]
fn a_container_asks_for_devices_by_count_and_dies_from_few_cards() {
    let config = vendor_config();
    let parsed = |limits, annotations| parse_pod(&pod(limits, annotations), &config);
    for limits in [json!({VA: "1"}), json!({})] {
        let with_request = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "image": "i",
                "resources": {"limits": limits, "requests": {VA: "1"}}}]},
        }))
        .unwrap();
        let request = parse_pod(&with_request, &config).unwrap().unwrap();
        let wanted = &request.containers[0];
        let vendor = wanted.vendor.as_ref().unwrap();
        assert_eq!(
            (wanted.family, wanted.count, wanted.memory, wanted.cores),
            (DeviceFamily::Vastai, 1, MemoryRequest::Mib(0), 0),
            "HAMi's GenerateResourceRequests, from limits or requests"
        );
        assert!(vendor.by_network && vendor.mutex_by_network);
    }
    assert_eq!(parsed(json!({}), json!({})).unwrap(), None);
    let error = parsed(json!({VA: "-1"}), json!({}))
        .unwrap_err()
        .to_string();
    assert!(error.contains(VA) && error.contains("negative"), "{error}");
}

#[test]
fn bind_hands_the_plugin_hamis_lists_and_the_mutex_lock() {
    let slice = DeviceSlice {
        uuid: "test1".into(),
        family: DeviceFamily::Vastai,
        model: "Vastai".into(),
        memory_mib: 1,
        ..DeviceSlice::default()
    };
    let spec = allocation("p", "u", "n1")
        .container(container("main", vec![slice]))
        .build()
        .spec;
    let names = ["main".to_owned()];
    let handoff = vendor_config().families().hand_off(&Binding {
        spec: &spec,
        containers: &names,
        devices: &[],
        namespace: "ml",
        pod: "p",
        now: Timestamp::from_second(1_700_000_000).unwrap(),
    });
    // HAMi's PatchAnnotations, with what Vastai's Fit leaves in memory and
    // cores (0).
    for key in [
        "hami.io/Vastai-devices-to-allocate",
        "hami.io/Vastai-devices-allocated",
    ] {
        assert_eq!(
            handoff.pod.get(key).map(String::as_str),
            Some("test1,Vastai,0,0:;"),
            "{key}"
        );
    }
    assert!(handoff.node[MUTEX_LOCK].ends_with(",ml,p"));
}
