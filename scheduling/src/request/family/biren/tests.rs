//! HAMi's Biren cases (`pkg/device/biren/device_test.go`): the request
//! (`TestDevices_GenerateResourceRequests`) and the hand-off
//! (`Test_PatchAnnotations`). The placement (`TestDevices_Fit`) is the
//! engine's: `engine/counted_tests.rs`.

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tessera_api::{
    names::handoff::{BIND_PHASE, MUTEX_LOCK, VGPU_NODE},
    testing::{allocation, container},
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use crate::request::vendor_tests::pod;
use crate::request::{Binding, MemoryRequest, parse_pod, vendor_config};

const GPU: &str = "birentech.com/gpu";

#[test]
fn a_container_asks_for_gpus_by_count_alone() {
    let config = vendor_config();
    let parsed = |limits, annotations| parse_pod(&pod(limits, annotations), &config);
    let request = parsed(json!({GPU: "2"}), json!({})).unwrap().unwrap();
    let [wanted] = request.containers.as_slice() else {
        panic!("one request: {request:?}");
    };
    assert_eq!(
        (wanted.family, wanted.count, wanted.memory, wanted.cores),
        (DeviceFamily::Biren, 2, MemoryRequest::Mib(0), 0),
        "HAMi's GenerateResourceRequests: the count, no memory, no cores"
    );
    assert_eq!(parsed(json!({GPU: "0"}), json!({})).unwrap(), None);
    let error = parsed(json!({GPU: "1.5"}), json!({}))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(GPU) && error.contains("whole number"),
        "{error}"
    );
    // HAMi's CheckUUID: a comma list, entries trimmed.
    let filtered = parsed(
        json!({GPU: "1"}),
        json!({"birentech.com/use-gpuuuid": "a, b"}),
    )
    .unwrap()
    .unwrap();
    let filters = &filtered.containers[0].vendor.as_ref().unwrap().filters;
    assert_eq!(
        filters
            .use_uuids
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

#[test]
fn bind_hands_the_plugin_hamis_lists_and_the_mutex_lock() {
    let slice = |uuid: &str| DeviceSlice {
        uuid: uuid.into(),
        family: DeviceFamily::Biren,
        model: "Biren".into(),
        memory_mib: 1,
        ..DeviceSlice::default()
    };
    let spec = allocation("p", "u", "n1")
        .container(container("main", vec![slice("test1")]))
        .container(container("side", vec![slice("test2"), slice("test3")]))
        .build()
        .spec;
    let names = ["init".to_owned(), "main".to_owned(), "side".to_owned()];
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let handoff = vendor_config().families().hand_off(&Binding {
        spec: &spec,
        containers: &names,
        devices: &[],
        namespace: "ml",
        pod: "p",
        now,
    });
    // HAMi's PatchAnnotations: `test1,Biren,<Usedmem>,<Usedcores>:;` per
    // container; Biren's Fit leaves memory and cores 0.
    let listed = ";test1,Biren,0,0:;test2,Biren,0,0:test3,Biren,0,0:;";
    for key in [
        "hami.io/Biren-devices-to-allocate",
        "hami.io/Biren-devices-allocated",
    ] {
        assert_eq!(
            handoff.pod.get(key).map(String::as_str),
            Some(listed),
            "{key}"
        );
    }
    assert_eq!(handoff.pod[VGPU_NODE], "n1");
    assert_eq!(handoff.pod[BIND_PHASE], "allocating");
    assert!(
        handoff.node[MUTEX_LOCK].ends_with(",ml,p"),
        "{:?}",
        handoff.node
    );
    assert!(handoff.unclaimed.is_empty());
}
