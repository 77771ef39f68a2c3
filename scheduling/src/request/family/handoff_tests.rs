//! HAMi's hand-off encodings, family by family.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use tessera_api::{
    names::handoff::{BIND_PHASE, BIND_TIME, MUTEX_LOCK, VGPU_NODE},
    testing::{allocation, container},
    v1alpha1::{DeviceFamily, DeviceSlice, VgpuAllocationSpec},
};

use super::{Binding, Handoff, NodeDevice, mutex_held_by, mutex_value};
use crate::request::{RequestConfig, VnpuConfig, VnpusConfig, vendor_config};

/// Bind's hand-off for `spec` under `config`, on a node of `devices`, for
/// the pod `ml/p`.
fn hand_off(
    spec: &VgpuAllocationSpec,
    containers: &[String],
    config: &RequestConfig,
    devices: &[NodeDevice<'_>],
    now: Timestamp,
) -> Handoff {
    config.families().hand_off(&Binding {
        spec,
        containers,
        devices,
        namespace: "ml",
        pod: "p",
        now,
    })
}

/// The pod annotations Bind writes for `spec`.
fn pod_annotations(
    spec: &VgpuAllocationSpec,
    containers: &[String],
    config: &RequestConfig,
    now: Timestamp,
) -> BTreeMap<String, String> {
    hand_off(spec, containers, config, &[], now).pod
}

/// The Node annotations Bind writes for `spec`, every family enabled.
fn node_annotations(
    spec: &VgpuAllocationSpec,
    namespace: &str,
    pod: &str,
    now: Timestamp,
) -> BTreeMap<String, String> {
    assert_eq!((namespace, pod), ("ml", "p"), "the pod `hand_off` binds");
    hand_off(spec, &[], &vendor_config(), &[], now).node
}

fn slice(
    uuid: &str,
    family: DeviceFamily,
    model: &str,
    mib: u64,
    cores: u32,
    template: Option<&str>,
) -> DeviceSlice {
    DeviceSlice {
        uuid: uuid.into(),
        family,
        model: model.into(),
        memory_mib: mib,
        cores,
        template: template.map(Into::into),
        ..DeviceSlice::default()
    }
}

#[test]
fn hygon_devices_are_encoded_per_container_with_empty_entries_kept() {
    let spec = allocation("p", "u", "n1")
        .container(container(
            "main",
            vec![
                slice("DCU-0", DeviceFamily::Hygon, "DCU-Z100", 4096, 30, None),
                slice("DCU-1", DeviceFamily::Hygon, "DCU-Z100", 4096, 30, None),
            ],
        ))
        .build()
        .spec;
    let order = vec!["init".to_owned(), "main".to_owned(), "sidecar".to_owned()];
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(&spec, &order, &vendor_config(), now);
    assert_eq!(
        out["hami.io/dcu-devices-to-allocate"],
        ";DCU-0,DCU,4096,30:DCU-1,DCU,4096,30:;;"
    );
    assert_eq!(
        out["hami.io/dcu-devices-allocated"],
        out["hami.io/dcu-devices-to-allocate"]
    );
    assert_eq!(out[VGPU_NODE], "n1");
    assert_eq!(out[BIND_PHASE], "allocating");
    assert_eq!(out[BIND_TIME], "1795773600");
    assert!(!out.contains_key("huawei.com/DCU"));
}

#[test]
fn ascend_gets_hamis_runtime_info_with_the_template() {
    let config = RequestConfig {
        vnpus: Some(VnpusConfig {
            hami_vnpu_core: false,
            configs: vec![VnpuConfig {
                common_word: "Ascend910B4".into(),
                ..VnpuConfig::default()
            }],
        }),
        ..RequestConfig::default()
    };
    let spec = allocation("p", "u", "n1")
        .container(container(
            "main",
            vec![slice(
                "NPU-3",
                DeviceFamily::Ascend,
                "Ascend910B4",
                8192,
                0,
                Some("vir05_1c_8g"),
            )],
        ))
        .build()
        .spec;
    let out = pod_annotations(&spec, &["main".to_owned()], &config, Timestamp::now());
    assert_eq!(
        out["hami.io/Ascend910B4-devices-to-allocate"],
        "NPU-3,Ascend910B4,8192,0:;"
    );
    assert_eq!(
        out["huawei.com/Ascend910B4"],
        r#"[{"UUID":"NPU-3","temp":"vir05_1c_8g","memory":8192}]"#
    );
    assert!(out.contains_key("predicate-time"));
}

#[test]
fn iluvatar_devices_are_keyed_by_their_chip() {
    let spec = allocation("p", "u", "n1")
        .container(container(
            "main",
            vec![slice(
                "ilu-0",
                DeviceFamily::Iluvatar,
                "MR-V100",
                4096,
                50,
                None,
            )],
        ))
        .build()
        .spec;
    let out = pod_annotations(
        &spec,
        &["main".to_owned()],
        &vendor_config(),
        Timestamp::now(),
    );
    assert_eq!(
        out["hami.io/MR-V100-devices-to-allocate"],
        "ilu-0,MR-V100,4096,50:;"
    );
    assert!(!out.contains_key("huawei.com/MR-V100"));
}

#[test]
fn cambricon_gets_its_profile_and_its_own_node_lock() {
    let mut mlu = slice(
        "node-cambricon-mlu-1",
        DeviceFamily::Cambricon,
        "MLU",
        4096,
        50,
        None,
    );
    mlu.index = 1;
    let spec = allocation("p", "u", "n1")
        .container(container("main", vec![mlu]))
        .build()
        .spec;
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(
        &spec,
        &["init".to_owned(), "main".to_owned()],
        &vendor_config(),
        now,
    );
    assert_eq!(
        out["hami.io/cambricon-mlu-devices-to-allocate"],
        ";node-cambricon-mlu-1,MLU,4096,50:;"
    );
    assert_eq!(out["CAMBRICON_DSMLU_PROFILE"], "1_50_16");
    assert_eq!(out["CAMBRICON_DSMLU_ASSIGNED"], "false");
    // Cambricon's plugin finds the pod by its own spelling.
    assert_eq!(out["CAMBRICON_DSMLU_ASSIGHED"], "false");
    let node = node_annotations(&spec, "ml", "p", now);
    assert_eq!(
        node,
        BTreeMap::from([(
            "cambricon.com/dsmlu.lock".to_owned(),
            "2026-11-27T10:00:00Z".to_owned()
        )])
    );
    let dcu = allocation("p", "u", "n1")
        .container(container(
            "main",
            vec![slice("DCU-0", DeviceFamily::Hygon, "DCU", 1, 1, None)],
        ))
        .build()
        .spec;
    assert_eq!(
        node_annotations(&dcu, "ml", "p", now)
            .keys()
            .collect::<Vec<_>>(),
        ["hami.io/mutex.lock"]
    );
}

#[test]
fn moore_threads_gets_card_indexes_and_no_lock() {
    let mut gpu = slice(
        "n1-mthreads-1",
        DeviceFamily::Mthreads,
        "Mthreads",
        8192,
        4,
        None,
    );
    gpu.index = 1;
    let spec = allocation("p", "u", "n1")
        .container(container("main", vec![gpu]))
        .build()
        .spec;
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(&spec, &["main".to_owned()], &vendor_config(), now);
    assert_eq!(
        out["hami.io/mthreads-vgpu-devices-allocated"],
        "n1-mthreads-1,Mthreads,8192,4:;"
    );
    assert!(!out.contains_key("hami.io/mthreads-vgpu-devices-to-allocate"));
    assert_eq!(out["mthreads.com/gpu-index"], "1");
    assert_eq!(out["mthreads.com/predicate-node"], "n1");
    assert_eq!(out["mthreads.com/predicate-time"], "1795773600000000000");
    assert!(
        node_annotations(&spec, "ml", "p", now).is_empty(),
        "HAMi takes no lock for Moore Threads"
    );
}

#[test]
fn metax_sgpus_get_hamis_lists_metax_json_and_the_mutex_lock() {
    let sgpu =
        |uuid: &str, mib, cores| slice(uuid, DeviceFamily::Metax, "Metax-SGPU", mib, cores, None);
    let spec = allocation("p", "u", "n1")
        .container(container("a", vec![sgpu("GPU-1", 4096, 60)]))
        .container(container(
            "b",
            vec![sgpu("GPU-2", 65536, 100), sgpu("GPU-3", 65536, 100)],
        ))
        .build()
        .spec;
    let order = ["a".to_owned(), "side".to_owned(), "b".to_owned()];
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(&spec, &order, &vendor_config(), now);
    let encoded =
        "GPU-1,Metax-SGPU,4096,60:;;GPU-2,Metax-SGPU,65536,100:GPU-3,Metax-SGPU,65536,100:;";
    assert_eq!(out["hami.io/metax-sgpu-devices-to-allocate"], encoded);
    assert_eq!(out["hami.io/metax-sgpu-devices-allocated"], encoded);
    // HAMi's PodMetaxSDevice: one list per container, Go's field names.
    assert_eq!(
        out["metax-tech.com/gpu-devices-allocated"],
        r#"[[{"uuid":"GPU-1","compute":60,"vRam":4096}],[],[{"uuid":"GPU-2","compute":100,"vRam":65536},{"uuid":"GPU-3","compute":100,"vRam":65536}]]"#
    );
    assert_eq!(out["metax-tech.com/predicate-time"], "1795773600000000000");
    assert_eq!(
        node_annotations(&spec, "ml", "p", now)[MUTEX_LOCK],
        "2026-11-27T10:00:00Z,ml,p"
    );
    // Whole GPUs: HAMi's two lists, no MetaX JSON, no lock.
    let spec = allocation("p", "u", "n1")
        .container(container(
            "a",
            vec![slice(
                "n1-metax-0",
                DeviceFamily::Metax,
                "Metax-GPU",
                65536,
                100,
                None,
            )],
        ))
        .build()
        .spec;
    let out = pod_annotations(&spec, &["a".to_owned()], &vendor_config(), now);
    assert_eq!(
        out["hami.io/metax-gpu-devices-to-allocate"],
        "n1-metax-0,Metax-GPU,65536,100:;"
    );
    assert_eq!(
        out["hami.io/metax-gpu-devices-allocated"],
        out["hami.io/metax-gpu-devices-to-allocate"]
    );
    assert!(!out.contains_key("metax-tech.com/gpu-devices-allocated"));
    assert!(node_annotations(&spec, "ml", "p", now).is_empty());
}

#[test]
fn enflame_gcus_get_hamis_two_lists_and_no_lock() {
    // HAMi's TestGCUDevices_PatchAnnotations.
    let spec = allocation("p", "u", "n1")
        .container(container(
            "a",
            vec![slice(
                "n1-GCU-0",
                DeviceFamily::Enflame,
                "GCU",
                100,
                100,
                None,
            )],
        ))
        .build()
        .spec;
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(&spec, &["a".to_owned()], &vendor_config(), now);
    assert_eq!(
        out["hami.io/enflame-gcu-devices-to-allocate"],
        "n1-GCU-0,GCU,100,100:;"
    );
    assert_eq!(
        out["hami.io/enflame-gcu-devices-allocated"],
        out["hami.io/enflame-gcu-devices-to-allocate"]
    );
    assert!(node_annotations(&spec, "ml", "p", now).is_empty());
}

#[test]
fn amd_gpus_are_written_with_their_product_type_and_take_the_lock() {
    // HAMi's amd Test_PatchAnnotations and Fit: `uuid,type,MiB,CUs:`,
    // the type the registered product name.
    let spec = allocation("p", "u", "n1")
        .container(container(
            "a",
            vec![
                slice(
                    "GPU-0",
                    DeviceFamily::Amd,
                    "AMD Instinct MI300X VF",
                    16384,
                    76,
                    None,
                ),
                slice(
                    "GPU-1",
                    DeviceFamily::Amd,
                    "AMD Instinct MI300X VF",
                    16384,
                    76,
                    None,
                ),
            ],
        ))
        .build()
        .spec;
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(&spec, &["a".to_owned()], &vendor_config(), now);
    let want = "GPU-0,AMD Instinct MI300X VF,16384,76:GPU-1,AMD Instinct MI300X VF,16384,76:;";
    assert_eq!(out["hami.io/amd-devices-to-allocate"], want);
    assert_eq!(out["hami.io/amd-devices-allocated"], want);
    assert_eq!(out[BIND_PHASE], "allocating");
    assert_eq!(
        node_annotations(&spec, "ml", "p", now)[MUTEX_LOCK],
        "2026-11-27T10:00:00Z,ml,p"
    );
}

#[test]
fn kunlunxin_whole_xpus_get_their_indexes_and_vxpus_the_lock() {
    // HAMi's kunlun PatchAnnotations: whole XPUs in
    // `hami.io/kunlun-allocated` and `BAIDU_COM_DEVICE_IDX`, no lock.
    let xpu = |uuid: &str, index: u32| DeviceSlice {
        index,
        ..slice(uuid, DeviceFamily::Kunlunxin, "kunlun", 98304, 100, None)
    };
    let spec = allocation("p", "u", "n1")
        .container(container(
            "a",
            vec![xpu("n1-kunlun-4", 4), xpu("n1-kunlun-6", 6)],
        ))
        .build()
        .spec;
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(&spec, &["a".to_owned()], &vendor_config(), now);
    assert_eq!(
        out["hami.io/kunlun-allocated"],
        "n1-kunlun-4,kunlun,98304,100:n1-kunlun-6,kunlun,98304,100:;"
    );
    assert_eq!(out["BAIDU_COM_DEVICE_IDX"], "4,6");
    assert!(!out.contains_key("hami.io/kunlun-devices-to-allocate"));
    assert!(node_annotations(&spec, "ml", "p", now).is_empty());
    // vXPUs: HAMi's vdevice PatchAnnotations, under hami.io/mutex.lock.
    let spec = allocation("p", "u", "n1")
        .container(container(
            "a",
            vec![slice(
                "xpu-0",
                DeviceFamily::Kunlunxin,
                "XPU",
                24576,
                25,
                None,
            )],
        ))
        .build()
        .spec;
    let out = pod_annotations(&spec, &["a".to_owned()], &vendor_config(), now);
    assert_eq!(
        out["hami.io/xpu-devices-to-allocate"],
        "xpu-0,XPU,24576,25:;"
    );
    assert_eq!(out["hami.io/xpu-devices-allocated"], "xpu-0,XPU,24576,25:;");
    assert!(node_annotations(&spec, "ml", "p", now).contains_key(MUTEX_LOCK));
}

#[test]
fn aws_neuron_devices_and_cores_are_handed_off_as_hami_does() {
    // HAMi's awsneuron TestPatchAnnotations: by count, device indexes;
    // by cores, the node's core numbers and the core resource.
    let neuron = |uuid: &str, index: u32, cores: u32, held: &[u32]| DeviceSlice {
        index,
        core_indexes: held.to_vec(),
        ..slice(uuid, DeviceFamily::AwsNeuron, "inf2.xlarge", 0, cores, None)
    };
    let config = RequestConfig {
        awsneuron: Some(crate::request::AwsNeuronConfig::default()),
        ..RequestConfig::default()
    };
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let by_count = allocation("p", "u", "n1")
        .container(container(
            "a",
            vec![neuron("test1", 0, 2, &[]), neuron("test2", 1, 2, &[])],
        ))
        .build()
        .spec;
    let out = pod_annotations(&by_count, &["a".to_owned()], &config, now);
    assert_eq!(
        out["hami.io/aws-neuron-devices-allocated"],
        "test1,AWSNeuron,0,3:test2,AWSNeuron,0,3:;"
    );
    assert_eq!(out["NEURON_ALLOCATED"], "false");
    assert_eq!(out["aws.amazon.com/predicate-node"], "n1");
    let devices = ["test1", "test2"].map(|uuid| NodeDevice {
        uuid,
        cores: 2,
        ..NodeDevice::default()
    });
    let ids = hand_off(&by_count, &["a".to_owned()], &config, &devices, now).pod;
    assert_eq!(ids["AWS_NEURON_IDS"], "0,1");
    assert!(!ids.contains_key("NEURON_RESOURCE_TYPE"));
    let by_core = allocation("p", "u", "n1")
        .container(container("a", vec![neuron("test2", 1, 1, &[1])]))
        .build()
        .spec;
    let out = pod_annotations(&by_core, &["a".to_owned()], &config, now);
    assert_eq!(
        out["hami.io/aws-neuron-devices-allocated"],
        "test2,AWSNeuron,0,2:;"
    );
    let ids = hand_off(&by_core, &["a".to_owned()], &config, &devices, now).pod;
    assert_eq!(ids["AWS_NEURON_IDS"], "3", "device 1, its second core");
    assert_eq!(ids["NEURON_RESOURCE_TYPE"], "aws.amazon.com/neuroncore");
    assert!(
        node_annotations(&by_core, "ml", "p", now).is_empty(),
        "no lock, as HAMi"
    );
}

#[test]
fn enflame_drs_partitions_are_handed_off_as_hami_does() {
    // HAMi's enflame PatchAnnotations: the list, assigned=false, the
    // first container's GCU index, minor and slices, and per container
    // its partition.
    let drs = |uuid: &str, index: u32| DeviceSlice {
        index,
        ..slice(
            uuid,
            DeviceFamily::Enflame,
            "Enflame",
            20480,
            50,
            Some("3g.20gb"),
        )
    };
    let spec = allocation("p", "u", "n1")
        .container(container("a", vec![drs("n1-enflame-drs-1", 1)]))
        .container(container("b", vec![drs("n1-enflame-drs-0", 0)]))
        .build()
        .spec;
    let order = ["a".to_owned(), "b".to_owned()];
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let out = pod_annotations(&spec, &order, &vendor_config(), now);
    assert_eq!(
        out["hami.io/enflame-vgpu-devices-allocated"],
        "n1-enflame-drs-1,Enflame,20480,50:;n1-enflame-drs-0,Enflame,20480,50:;"
    );
    assert_eq!(out["enflame.com/gcu-assigned"], "false");
    assert!(
        node_annotations(&spec, "ml", "p", now).is_empty(),
        "no lock, as HAMi"
    );
    // Each GCU's minor, and the plugin's id of the profile the slices
    // name, from the GpuNode.
    let minors = ["minor-of-n1-enflame-drs-1", "minor-of-n1-enflame-drs-0"];
    let devices = ["n1-enflame-drs-1", "n1-enflame-drs-0"]
        .into_iter()
        .zip(minors)
        .map(|(uuid, minor)| NodeDevice {
            uuid,
            minor: Some(minor),
            profiles: vec![("3g.20gb", "1")],
            ..NodeDevice::default()
        })
        .collect::<Vec<_>>();
    let extra = hand_off(&spec, &order, &vendor_config(), &devices, now).pod;
    assert_eq!(extra["enflame.com/gcu-assigned-index"], "1");
    assert_eq!(extra["enflame.com/gcu-assigned-id"], "1");
    assert_eq!(
        extra["enflame.com/gcu-assigned-minor"],
        "minor-of-n1-enflame-drs-1"
    );
    assert_eq!(extra["enflame.com/gcu-request-size"], "3");
    assert_eq!(
        extra["assigned-containers"],
        r#"{"a":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"},"b":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"}}"#
    );
}

#[test]
fn an_nvidia_only_allocation_writes_nothing() {
    let spec = allocation("p", "u", "n1")
        .container(container(
            "main",
            vec![tessera_api::testing::slice("GPU-0", 0, 1000, 10)],
        ))
        .build()
        .spec;
    assert!(
        pod_annotations(
            &spec,
            &["main".to_owned()],
            &RequestConfig::default(),
            Timestamp::now()
        )
        .is_empty()
    );
}

#[test]
fn the_node_lock_is_hamis_time_namespace_pod() {
    let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
    let value = mutex_value("ml", "train", now);
    assert_eq!(value, "2026-11-27T10:00:00Z,ml,train");
    assert!(mutex_held_by(&value, "ml", "train"));
    assert!(!mutex_held_by(&value, "ml", "rain"));
}

#[test]
fn a_slice_no_enabled_family_claims_is_reported_not_handed_off_as_nothing() {
    // The configuration lost the Hygon section (and has Iluvatar's MR-V100
    // only) between Filter and Bind: Bind must not write a hand-off that
    // leaves a plugin without its devices.
    let spec = allocation("p", "u", "n1")
        .container(container(
            "main",
            vec![
                slice("DCU-0", DeviceFamily::Hygon, "DCU-Z100", 4096, 30, None),
                slice("ilu-0", DeviceFamily::Iluvatar, "BI-V150", 4096, 30, None),
                tessera_api::testing::slice("GPU-0", 0, 1000, 10),
            ],
        ))
        .build()
        .spec;
    let mut config = vendor_config();
    config.hygon = None;
    let out = hand_off(&spec, &["main".to_owned()], &config, &[], Timestamp::now());
    assert_eq!(out.unclaimed, ["DCU-0", "ilu-0"]);
    assert!(!out.pod.contains_key("hami.io/dcu-devices-to-allocate"));
    let all = hand_off(
        &spec,
        &["main".to_owned()],
        &vendor_config(),
        &[],
        Timestamp::now(),
    );
    assert_eq!(all.unclaimed, ["ilu-0"], "BI-V150 is not a configured chip");
}
