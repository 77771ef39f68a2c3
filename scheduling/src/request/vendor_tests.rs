//! Hygon and Ascend requests, one row per HAMi rule (HAMi's
//! `GenerateResourceRequests` and `MutateAdmission` cases).

use k8s_openapi::api::core::v1::Pod;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;
use tessera_api::v1alpha1::DeviceFamily;

fn config() -> RequestConfig {
    super::fixtures::vendor_config()
}

pub(super) fn pod(limits: Value, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }))
    .unwrap()
}

fn parsed(limits: Value, annotations: Value) -> Result<Vec<ContainerRequest>, String> {
    parse_pod(&pod(limits, annotations), &config())
        .map(|r| r.map(|r| r.containers).unwrap_or_default())
        .map_err(|e| e.to_string())
}

/// (family, count, memory, cores, template)
fn shape(r: &ContainerRequest) -> (DeviceFamily, u32, MemoryRequest, u32, Option<String>) {
    (
        r.family,
        r.count,
        r.memory,
        r.cores,
        r.vendor.as_ref().and_then(|v| v.template.clone()),
    )
}

#[test]
fn hygon_requests_follow_hami() {
    use MemoryRequest::{Mib, Percent};
    let rows = [
        (json!({"hygon.com/dcunum": "1"}), (1, Percent(100), 100)),
        (
            json!({"hygon.com/dcunum": "2", "hygon.com/dcumem": "4096", "hygon.com/dcucores": "30"}),
            (2, Mib(4096), 30),
        ),
        (
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "0"}),
            (1, Percent(100), 100),
        ),
        (
            json!({"hygon.com/dcunum": "1", "hygon.com/dcucores": "250"}),
            (1, Percent(100), 100),
        ),
    ];
    for (limits, (count, memory, cores)) in rows {
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(
            shape(&got[0]),
            (DeviceFamily::Hygon, count, memory, cores, None),
            "{limits}"
        );
    }
    assert_eq!(
        parsed(json!({"hygon.com/dcunum": "0"}), json!({})).unwrap(),
        vec![]
    );
    let filters = parsed(
        json!({"hygon.com/dcunum": "1"}),
        json!({"hygon.com/use-dcutype": "Z100, K100", "hygon.com/nouse-gpuuuid": "DCU-3"}),
    )
    .unwrap();
    let f = &filters[0].vendor.as_ref().unwrap().filters;
    assert_eq!(
        (f.use_types.clone(), f.nouse_uuids.clone()),
        (
            vec!["z100".to_owned(), "k100".to_owned()],
            ["DCU-3".to_owned()].into()
        )
    );
}

#[test]
fn ascend_memory_rounds_up_to_a_template_or_the_whole_card() {
    use MemoryRequest::Mib;
    let rows = [
        (json!({"huawei.com/Ascend910A": "1"}), (1, Mib(32768), None)),
        (
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "3000"}),
            (1, Mib(4369), Some("vir04")),
        ),
        (
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "2184"}),
            (1, Mib(2184), Some("vir02")),
        ),
        (
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "20000"}),
            (1, Mib(32768), None),
        ),
        (
            json!({"huawei.com/Ascend910A": "2", "huawei.com/Ascend910A-memory": "32768"}),
            (2, Mib(32768), None),
        ),
        (json!({"huawei.com/Ascend910C": "1"}), (2, Mib(65536), None)),
        (json!({"huawei.com/Ascend910C": "4"}), (4, Mib(65536), None)),
    ];
    for (limits, (count, memory, template)) in rows {
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(
            shape(&got[0]),
            (
                DeviceFamily::Ascend,
                count,
                memory,
                0,
                template.map(str::to_owned)
            ),
            "{limits}"
        );
    }
    let soft = parsed(
        json!({"huawei.com/Ascend910A": "2", "huawei.com/Ascend910A-memory": "3000", "huawei.com/Ascend910A-core": "40"}),
        json!({"huawei.com/vnpu-mode": "hami-core"}),
    )
    .unwrap();
    assert_eq!(
        shape(&soft[0]),
        (DeviceFamily::Ascend, 2, Mib(3000), 40, None),
        "soft split takes memory as asked"
    );
    assert!(soft[0].vendor.as_ref().unwrap().soft_split);
}

#[test]
fn broken_vendor_rules_are_refused_naming_the_container_field_and_rule() {
    let rows = [
        (
            json!({"hygon.com/dcumem": "1024"}),
            json!({}),
            "container \"c\": hygon.com/dcumem: is set but hygon.com/dcunum is not; ask for at least 1 DCU",
        ),
        (
            json!({"hygon.com/dcunum": "1.5"}),
            json!({}),
            "hygon.com/dcunum: must be a whole number",
        ),
        (
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "40000"}),
            json!({}),
            "huawei.com/Ascend910A-memory: 40000 MiB is more than a Ascend910A card holds (32768 MiB)",
        ),
        (
            json!({"huawei.com/Ascend910A": "2", "huawei.com/Ascend910A-memory": "3000"}),
            json!({}),
            "a vNPU (4369 MiB, template vir04) can only be asked for with huawei.com/Ascend910A: 1",
        ),
        (
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-core": "10"}),
            json!({}),
            "huawei.com/Ascend910A-core: is only supported with the pod annotation huawei.com/vnpu-mode: hami-core",
        ),
        (
            json!({"huawei.com/Ascend910A": "1"}),
            json!({"huawei.com/vnpu-mode": "soft"}),
            "annotation huawei.com/vnpu-mode: must be \"hami-core\"",
        ),
        (
            json!({"huawei.com/Ascend910C": "3"}),
            json!({}),
            "huawei.com/Ascend910C: must be 1 or an even number, got 3",
        ),
        (
            json!({"huawei.com/Ascend910A-memory": "3000"}),
            json!({}),
            "is set but huawei.com/Ascend910A is not",
        ),
    ];
    for (limits, annotations, want) in rows {
        let error = parsed(limits.clone(), annotations).expect_err(want);
        assert!(
            error.contains(want),
            "{limits}: {error:?} should say {want:?}"
        );
    }
    // A core of 0 is no core: allowed without hami-core (HAMi's case).
    assert!(
        parsed(
            json!({"huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-core": "0"}),
            json!({})
        )
        .is_ok()
    );
}

#[test]
fn cambricon_requests_follow_hami() {
    use MemoryRequest::{Mib, Percent};
    let rows = [
        (json!({"cambricon.com/vmlu": "1"}), (1, Percent(100), 100)),
        (
            json!({"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "16", "cambricon.com/mlu.smlu.vcore": "50"}),
            (1, Mib(4096), 50),
        ),
        (
            json!({"cambricon.com/vmlu": "2", "cambricon.com/mlu.smlu.vcore": "200"}),
            (2, Percent(100), 100),
        ),
    ];
    for (limits, (count, memory, cores)) in rows {
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(
            shape(&got[0]),
            (DeviceFamily::Cambricon, count, memory, cores, None),
            "{limits}"
        );
    }
    let error = parsed(json!({"cambricon.com/mlu.smlu.vcore": "50"}), json!({})).unwrap_err();
    assert!(error.contains("cambricon.com/mlu.smlu.vcore: is set but cambricon.com/vmlu is not; ask for at least 1 MLU"), "{error}");
}

#[test]
fn moore_threads_requests_follow_hami() {
    use MemoryRequest::Mib;
    let rows = [
        (json!({"mthreads.com/vgpu": "1"}), (1, Mib(49152), 16)),
        (
            json!({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "4"}),
            (1, Mib(4096), 4),
        ),
        (
            json!({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "2"}),
            (1, Mib(1024), 0),
        ),
        (
            json!({"mthreads.com/vgpu": "2", "mthreads.com/sgpu-memory": "8"}),
            (2, Mib(49152), 16),
        ),
        // What HAMi's (and Tessera's) webhook writes for two whole cards.
        (
            json!({"mthreads.com/vgpu": "2", "mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "192"}),
            (2, Mib(49152), 16),
        ),
    ];
    for (limits, (count, memory, cores)) in rows {
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(
            shape(&got[0]),
            (DeviceFamily::Mthreads, count, memory, cores, None),
            "{limits}"
        );
        assert!(got[0].vendor.as_ref().unwrap().one_card_per_pod);
    }
    for (limits, want) in [
        (
            json!({"mthreads.com/vgpu": "0"}),
            "mthreads.com/vgpu: must be greater than 0",
        ),
        (
            json!({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "3"}),
            "must be one of 2, 4, 8, 16, 32, 64, 96",
        ),
        (
            json!({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "17"}),
            "mthreads.com/sgpu-core: must be at most 16 (a card's compute units) for one GPU, got 17",
        ),
    ] {
        let error = parsed(limits.clone(), json!({})).unwrap_err();
        assert!(error.contains(want), "{limits}: {error}");
    }
}

#[test]
fn iluvatar_requests_follow_hami() {
    use MemoryRequest::{Mib, Percent};
    let rows = [
        (
            json!({"iluvatar.ai/MR-V100-vgpu": "1"}),
            (1, Percent(100), 0),
        ),
        (
            json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "16", "iluvatar.ai/MR-V100.vCore": "50"}),
            (1, Mib(4096), 50),
        ),
        (
            json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vCore": "300"}),
            (1, Percent(100), 100),
        ),
        // More than one GPU: whole GPUs (HAMi writes 100 × count cores).
        (
            json!({"iluvatar.ai/MR-V100-vgpu": "2", "iluvatar.ai/MR-V100.vMem": "4"}),
            (2, Mib(1024), 100),
        ),
    ];
    for (limits, (count, memory, cores)) in rows {
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(
            shape(&got[0]),
            (DeviceFamily::Iluvatar, count, memory, cores, None),
            "{limits}"
        );
        assert_eq!(
            got[0].vendor.as_ref().unwrap().device_type.as_deref(),
            Some("MR-V100")
        );
    }
    let error = parsed(json!({"iluvatar.ai/MR-V100.vMem": "4"}), json!({})).unwrap_err();
    assert!(
        error.contains("iluvatar.ai/MR-V100.vMem: is set but iluvatar.ai/MR-V100-vgpu is not"),
        "{error}"
    );
}

#[test]
fn a_container_may_ask_for_several_families() {
    let got = parsed(
        json!({"nvidia.com/gpu": "1", "hygon.com/dcunum": "1", "huawei.com/Ascend910A": "1"}),
        json!({}),
    )
    .unwrap();
    let families: Vec<DeviceFamily> = got.iter().map(|r| r.family).collect();
    assert_eq!(
        families,
        [
            DeviceFamily::Nvidia,
            DeviceFamily::Hygon,
            DeviceFamily::Ascend
        ]
    );
    assert!(got.iter().all(|r| r.name == "c"));
}

#[test]
fn hamis_vendor_sections_are_read_as_written_and_checked() {
    // From HAMi's charts/hami/templates/scheduler/device-configmap.yaml.
    let yaml = r#"
hygon:
  resourceCountName: hygon.com/dcunum
  resourceMemoryName: hygon.com/dcumem
  resourceCoreName: hygon.com/dcucores
  memoryFactor: 1
vnpus:
  hamiVnpuCore: false
  configs:
  - chipName: 310P3
    commonWord: Ascend310P
    resourceName: huawei.com/Ascend310P
    resourceMemoryName: huawei.com/Ascend310P-memory
    resourceCoreName: huawei.com/Ascend310P-core
    memoryAllocatable: 21527
    memoryCapacity: 24576
    memoryFactor: 1
    aiCore: 8
    aiCPU: 7
    runtimeClassName: ""
    overwriteEnv: false
    templates:
      - name: vir01
        memory: 3072
        aiCore: 1
        aiCPU: 1
"#;
    let config: RequestConfig = serde_yaml_ng::from_str(yaml).unwrap();
    config.validate().unwrap();
    let chip = &config.vnpus.as_ref().unwrap().configs[0];
    assert_eq!(chip.trim_memory(3000), Some((3072, Some("vir01"))));
    assert_eq!(
        chip.trim_memory(24000),
        Some((21527, None)),
        "above every template: the whole card"
    );
    assert_eq!(chip.trim_memory(24577), None);
    assert!(
        config
            .resource_names()
            .contains(&"huawei.com/Ascend310P-memory")
    );

    let mut clash = config.clone();
    clash.hygon.as_mut().unwrap().resource_count_name = "nvidia.com/gpu".into();
    assert!(
        clash
            .validate()
            .unwrap_err()
            .to_string()
            .contains("distinct")
    );
    let mut bad = config;
    bad.vnpus.as_mut().unwrap().configs[0].memory_allocatable = 30000;
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "config vnpus.configs[0].memoryAllocatable: must not exceed memoryCapacity"
    );
}

#[test]
fn metax_requests_follow_hami() {
    use MemoryRequest::{Mib, Percent};
    // HAMi's TestGenerateResourceRequests (sdevice_test.go) and the whole
    // GPU's (device_test.go): (limits, (type, count, memory, cores)).
    let rows = [
        (
            json!({"metax-tech.com/gpu": "2"}),
            ("Metax-GPU", 2, Percent(100), 100),
        ),
        (
            json!({"metax-tech.com/sgpu": "1"}),
            ("Metax-SGPU", 1, Percent(100), 100),
        ),
        (
            json!({"metax-tech.com/sgpu": "2"}),
            ("Metax-SGPU", 2, Percent(100), 100),
        ),
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "60"}),
            ("Metax-SGPU", 1, Percent(100), 60),
        ),
        // A bare number is GiB.
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4"}),
            ("Metax-SGPU", 1, Mib(4096), 100),
        ),
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "60", "metax-tech.com/vmemory": "20"}),
            ("Metax-SGPU", 1, Mib(20480), 60),
        ),
        // A quantity with a unit is bytes.
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "60", "metax-tech.com/vmemory": "2048Mi"}),
            ("Metax-SGPU", 1, Mib(2048), 60),
        ),
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "60", "metax-tech.com/vmemory": "4Gi"}),
            ("Metax-SGPU", 1, Mib(4096), 60),
        ),
        // Above 100 counts as 100 (the other vendors' clamp).
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "150"}),
            ("Metax-SGPU", 1, Percent(100), 100),
        ),
    ];
    for (limits, (device_type, count, memory, cores)) in rows {
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(got.len(), 1, "{limits}");
        assert_eq!(
            shape(&got[0]),
            (DeviceFamily::Metax, count, memory, cores, None),
            "{limits}"
        );
        let vendor = got[0].vendor.as_ref().unwrap();
        assert_eq!(vendor.device_type.as_deref(), Some(device_type), "{limits}");
        assert_eq!(
            vendor.by_link_zone,
            device_type == "Metax-SGPU" && cores == 100
        );
    }
    let filters = parsed(
        json!({"metax-tech.com/sgpu": "1"}),
        json!({"metax-tech.com/use-gpuuuid": "a,b", "metax-tech.com/nouse-gpuuuid": "c"}),
    )
    .unwrap();
    let filters = &filters[0].vendor.as_ref().unwrap().filters;
    assert!(filters.use_uuids.iter().eq(["a", "b"]));
    assert!(filters.nouse_uuids.iter().eq(["c"]));
    // HAMi's range checks and TestMutateAdmission's refusals, each naming
    // the field and the rule.
    for (limits, annotations, want) in [
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "2099999999"}),
            json!({}),
            "metax-tech.com/vmemory: must be between 0 and 16384",
        ),
        (
            json!({"metax-tech.com/sgpu": "100"}),
            json!({}),
            "metax-tech.com/sgpu: must be between 0 and 64",
        ),
        (
            json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "1500Ki"}),
            json!({}),
            "metax-tech.com/vmemory: \"1500Ki\" is not a whole number of MiB; a bare number is GiB",
        ),
        (
            json!({"metax-tech.com/vcore": "50"}),
            json!({}),
            "metax-tech.com/vcore: is set but metax-tech.com/sgpu is not; ask for at least 1 sGPU",
        ),
        (
            json!({"metax-tech.com/sgpu": "1"}),
            json!({"metax-tech.com/sgpu-qos-policy": "always"}),
            "metax-tech.com/sgpu-qos-policy: must be one of best-effort, fixed-share, burst-share, got \"always\"",
        ),
        (
            json!({"metax-tech.com/sgpu": "2"}),
            json!({"metax-tech.com/sgpu-app-class": "offline"}),
            "metax-tech.com/sgpu-app-class: a pod with an app class must ask for exactly 1 sGPU, but metax-tech.com/sgpu is 2",
        ),
        (
            json!({"metax-tech.com/sgpu": "1"}),
            json!({"metax-tech.com/sgpu-app-class": "batch"}),
            "metax-tech.com/sgpu-app-class: must be online or offline, got \"batch\"",
        ),
    ] {
        let error = parsed(limits.clone(), annotations).unwrap_err();
        assert!(error.contains(want), "{limits}: {error}");
    }
    // An online pod's QoS policy is not checked (HAMi: online pods skip it).
    assert!(
        parsed(
            json!({"metax-tech.com/sgpu": "1"}),
            json!({"metax-tech.com/sgpu-app-class": "online", "metax-tech.com/sgpu-qos-policy": "x"}),
        )
        .is_ok()
    );
    // Without the count, the whole-GPU resource asks for nothing.
    assert_eq!(
        parsed(json!({"metax-tech.com/gpu": "0"}), json!({})).unwrap(),
        []
    );
}

#[test]
fn enflame_whole_gcus_and_drs_partitions_parse_as_hami_reads_them() {
    // HAMi's TestGCUDevices_GenerateResourceRequests.
    for count in [1, 2] {
        let limits = json!({"enflame.com/gcu": count.to_string()});
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(
            shape(&got[0]),
            (
                DeviceFamily::Enflame,
                count,
                MemoryRequest::Percent(100),
                100,
                None
            ),
            "{limits}"
        );
        assert_eq!(
            got[0].vendor.as_ref().unwrap().device_type.as_deref(),
            Some("GCU")
        );
    }
    // DRS (HAMi's TestMutateAdmission_*, GenerateResourceRequests): slices,
    // or memory and cores, always one GCU of type Enflame.
    for (limits, ask) in [
        (json!({"enflame.com/drs-gcu": "3"}), DrsAsk::Slices(3)),
        (
            json!({"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "50"}),
            DrsAsk::Spec {
                memory: 20480,
                cores: 50,
            },
        ),
        (
            json!({"enflame.com/gcu-core": "40"}),
            DrsAsk::Spec {
                memory: 0,
                cores: 40,
            },
        ),
    ] {
        let got = parsed(limits.clone(), json!({})).unwrap();
        assert_eq!(
            (got[0].family, got[0].count),
            (DeviceFamily::Enflame, 1),
            "{limits}"
        );
        let vendor = got[0].vendor.as_ref().unwrap();
        assert_eq!(vendor.device_type.as_deref(), Some("Enflame"));
        assert_eq!(vendor.drs, Some(ask), "{limits}");
    }
    for (limits, field, rule) in [
        (
            json!({"enflame.com/drs-gcu": "0"}),
            "enflame.com/drs-gcu",
            "must be between 1 and 64, got 0",
        ),
        (
            json!({"enflame.com/gcu-core": "101"}),
            "enflame.com/gcu-core",
            "must be between 1 and 100, got 101",
        ),
        (
            json!({"enflame.com/gcu-memory": "0"}),
            "enflame.com/gcu-memory",
            "must be between 1 and",
        ),
    ] {
        let error = parsed(limits.clone(), json!({})).unwrap_err();
        assert!(
            error.contains(&format!("{field}: {rule}")),
            "{limits}: {error}"
        );
    }
    // The legacy vGCU percentage, read by HAMi's scheduler nowhere.
    let mut config = config();
    config
        .enflame
        .as_mut()
        .unwrap()
        .resource_name_vgcu_percentage = "enflame.com/vgcu-percentage".into();
    let error = parse_pod(
        &pod(json!({"enflame.com/vgcu-percentage": "50"}), json!({})),
        &config,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("enflame.com/vgcu-percentage: is not read by HAMi's Enflame scheduler either; ask for DRS partitions with enflame.com/drs-gcu or whole GCUs with enflame.com/gcu"),
        "{error}"
    );
}

#[test]
fn amd_requests_follow_hami() {
    use MemoryRequest::{Mib, Percent};
    // HAMi's TestGenerateResourceRequests and TestMutateAdmission (amd).
    let rows = [
        (json!({"amd.com/gpu": "1"}), (1, Percent(100), 100)),
        (
            json!({"amd.com/gpu": "2", "amd.com/gpumem": "4096", "amd.com/gpucores": "33"}),
            (2, Mib(4096), 33),
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "4096"}),
            (1, Mib(4096), 100),
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "0", "amd.com/gpucores": "1"}),
            (1, Percent(100), 1),
        ),
    ];
    for (limits, (count, memory, cores)) in rows {
        let got = parsed(limits.clone(), json!({"amd.com/use-gputype": "MI300, "})).unwrap();
        assert_eq!(
            shape(&got[0]),
            (DeviceFamily::Amd, count, memory, cores, None),
            "{limits}"
        );
        let filters = &got[0].vendor.as_ref().unwrap().filters;
        assert_eq!(filters.use_types, vec!["mi300".to_owned()]);
    }
    for (limits, field, rule) in [
        (
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "0"}),
            "amd.com/gpucores",
            "must be between 1 and 100, got 0",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "101"}),
            "amd.com/gpucores",
            "must be between 1 and 100, got 101",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "-1"}),
            "amd.com/gpumem",
            "must not be negative",
        ),
        (
            json!({"amd.com/gpu": "2147483648"}),
            "amd.com/gpu",
            "must be between 0 and 64",
        ),
        (
            json!({"amd.com/gpumem": "4096"}),
            "amd.com/gpumem",
            "is set but amd.com/gpu is not; ask for at least 1 AMD GPU",
        ),
    ] {
        let error = parsed(limits.clone(), json!({})).unwrap_err();
        assert!(
            error.contains(&format!("{field}: {rule}")),
            "{limits}: {error}"
        );
    }
    // An empty memory or cores name (HAMi: optional) offers none.
    let mut config = config();
    config.amd = Some(AmdConfig {
        resource_memory_name: String::new(),
        resource_core_name: String::new(),
        ..AmdConfig::default()
    });
    config.validate().unwrap();
    let got = parse_pod(&pod(json!({"amd.com/gpu": "1"}), json!({})), &config)
        .unwrap()
        .unwrap();
    assert_eq!(got.containers[0].cores, 100);
}

#[test]
fn kunlunxin_requests_follow_hami() {
    use MemoryRequest::Mib;
    // HAMi's kunlun TestGenerateResourceRequests and vdevice trimMemory rows.
    let rows = [
        (
            json!({"kunlunxin.com/xpu": "1"}),
            (1, Mib(98304), 100),
            "kunlun",
        ),
        (
            json!({"kunlunxin.com/xpu": "8"}),
            (8, Mib(98304), 100),
            "kunlun",
        ),
        (
            json!({"kunlunxin.com/vxpu": "1"}),
            (1, Mib(98304), 100),
            "XPU",
        ),
        (
            json!({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "0"}),
            (1, Mib(24576), 25),
            "XPU",
        ),
        (
            json!({"kunlunxin.com/vxpu": "2", "kunlunxin.com/vxpu-memory": "24576"}),
            (2, Mib(24576), 25),
            "XPU",
        ),
        (
            json!({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "24577"}),
            (1, Mib(49152), 50),
            "XPU",
        ),
        (
            json!({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "49153"}),
            (1, Mib(98304), 100),
            "XPU",
        ),
        (
            json!({"kunlunxin.com/vxpu": "4", "kunlunxin.com/vxpu-memory": "200000"}),
            (4, Mib(98304), 100),
            "XPU",
        ),
    ];
    for (limits, (count, memory, cores), device_type) in rows {
        let got = parsed(
            limits.clone(),
            json!({"baidu.com/nouse-gpuuuid": "x-1", "hami.io/no-use-xpu-uuid": "x-2"}),
        )
        .unwrap();
        assert_eq!(
            shape(&got[0]),
            (DeviceFamily::Kunlunxin, count, memory, cores, None),
            "{limits}"
        );
        let vendor = got[0].vendor.as_ref().unwrap();
        assert_eq!(vendor.device_type.as_deref(), Some(device_type));
        assert!(vendor.by_wing);
        assert_eq!(vendor.same_size, device_type == "XPU");
        assert!(vendor.filters.nouse_uuids.iter().eq(["x-1", "x-2"]));
    }
    for (limits, field, rule) in [
        (
            json!({"kunlunxin.com/xpu": "3"}),
            "kunlunxin.com/xpu",
            "must be 1, 2, 4 or 8, got 3",
        ),
        (
            json!({"kunlunxin.com/vxpu": "9"}),
            "kunlunxin.com/vxpu",
            "must be between 0 and 8, got 9",
        ),
        (
            json!({"kunlunxin.com/vxpu-memory": "24576"}),
            "kunlunxin.com/vxpu-memory",
            "is set but kunlunxin.com/vxpu is not; ask for at least 1 vXPU",
        ),
    ] {
        let error = parsed(limits.clone(), json!({})).unwrap_err();
        assert!(
            error.contains(&format!("{field}: {rule}")),
            "{limits}: {error}"
        );
    }
}

#[test]
fn aws_neuron_requests_follow_hami() {
    // HAMi's awsneuron TestGenerateResourceRequests, TestMutateAdmission
    // and TestSplitCoreRequest: (count, cores as the engine reads them:
    // 100 for whole devices, by core index or not).
    let rows = [
        (json!({"aws.amazon.com/neuron": "2"}), (2, 100, false)),
        (
            json!({"aws.amazon.com/neuron": "1", "aws.amazon.com/neuroncore": "1"}),
            (1, 100, false),
        ),
        (json!({"aws.amazon.com/neuroncore": "1"}), (1, 1, true)),
        (json!({"aws.amazon.com/neuroncore": "2"}), (1, 2, true)),
        (json!({"aws.amazon.com/neuroncore": "6"}), (3, 100, true)),
    ];
    for (limits, (count, cores, by_core)) in rows {
        let got = parsed(
            limits.clone(),
            json!({"aws.amazon.com/nouse-neuron-uuid": "n-AWSNeuron-3"}),
        )
        .unwrap();
        assert_eq!(
            shape(&got[0]),
            (
                DeviceFamily::AwsNeuron,
                count,
                MemoryRequest::Percent(100),
                cores,
                None
            ),
            "{limits}"
        );
        let vendor = got[0].vendor.as_ref().unwrap();
        assert_eq!(vendor.by_core_index, by_core, "{limits}");
        assert_eq!(vendor.contiguous, count > 1, "{limits}");
        assert!(vendor.filters.nouse_uuids.iter().eq(["n-AWSNeuron-3"]));
        assert_eq!(vendor.device_type, None, "any device of the family");
    }
    for (limits, field, rule) in [
        (
            json!({"aws.amazon.com/neuroncore": "3"}),
            "aws.amazon.com/neuroncore",
            "must be 1 or a multiple of 2, got 3",
        ),
        (
            json!({"aws.amazon.com/neuroncore": "0"}),
            "aws.amazon.com/neuroncore",
            "must be between 1 and 128, got 0",
        ),
        (
            json!({"aws.amazon.com/neuron": "0"}),
            "aws.amazon.com/neuron",
            "must be between 1 and 64, got 0",
        ),
    ] {
        let error = parsed(limits.clone(), json!({})).unwrap_err();
        assert!(
            error.contains(&format!("{field}: {rule}")),
            "{limits}: {error}"
        );
    }
}
