//! Table-driven tests: one row per HAMi rule.

use k8s_openapi::api::core::v1::Pod;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;
use tessera_api::v1alpha1::{OperatingMode, SchedulingPolicy};
use tessera_api::{Error, Result, Violations};

fn pod(containers: Value, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
        "spec": {"containers": containers},
    }))
    .unwrap()
}

fn one(limits: Value) -> Pod {
    pod(
        json!([{"name": "c", "resources": {"limits": limits}}]),
        json!({}),
    )
}

fn req(count: u32, memory: MemoryRequest, cores: u32) -> ContainerRequest {
    ContainerRequest {
        name: "c".into(),
        kind: ContainerKind::App,
        count,
        memory,
        cores,
        priority: None,
        family: Default::default(),
        vendor: None,
    }
}

fn parse(pod: &Pod) -> Result<Option<PodRequest>> {
    parse_pod(pod, &RequestConfig::default())
}

fn containers(pod: &Pod) -> Vec<ContainerRequest> {
    parse(pod).unwrap().expect("a GPU request").containers
}

#[test]
fn valid_container_requests() {
    use MemoryRequest::{Mib, Percent};
    let cases: Vec<(&str, Value, ContainerRequest)> = vec![
        (
            "count alone is a whole exclusive device",
            json!({"nvidia.com/gpu": "1"}),
            req(1, Percent(100), 100),
        ),
        (
            "two whole devices",
            json!({"nvidia.com/gpu": 2}),
            req(2, Percent(100), 100),
        ),
        (
            "memory in MiB",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
            req(1, Mib(3000), 0),
        ),
        (
            "memory in percent",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
            req(1, Percent(50), 0),
        ),
        (
            "percent 100 is exclusive",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}),
            req(1, Percent(100), 100),
        ),
        (
            "explicit cores win over exclusivity",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}),
            req(1, Percent(100), 30),
        ),
        (
            "memory and cores",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
            req(1, Mib(3000), 30),
        ),
        (
            "gpumem without gpu means defaultGPUNum",
            json!({"nvidia.com/gpumem": "1024"}),
            req(1, Mib(1024), 0),
        ),
        (
            "gpucores without gpu means defaultGPUNum",
            json!({"nvidia.com/gpucores": "20"}),
            req(1, Percent(100), 20),
        ),
        (
            "quantity suffixes",
            json!({"nvidia.com/gpu": "2000m", "nvidia.com/gpumem": "4k"}),
            req(2, Mib(4000), 0),
        ),
        (
            "zero cores allowed",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10", "nvidia.com/gpucores": "0"}),
            req(1, Mib(10), 0),
        ),
    ];
    for (name, limits, want) in cases {
        assert_eq!(containers(&one(limits)), vec![want], "{name}");
    }
}

#[test]
fn invalid_container_requests_name_container_field_and_rule() {
    let cases: Vec<(&str, Value, &[&str])> = vec![
        (
            "gpumem with gpumem-percentage",
            json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "50"}),
            &[
                "container \"c\"",
                "nvidia.com/gpumem",
                "cannot be combined with nvidia.com/gpumem-percentage",
            ],
        ),
        (
            "cores above 100",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
            &[
                "container \"c\"",
                "nvidia.com/gpucores",
                "between 0 and 100, got 150",
            ],
        ),
        (
            "negative cores",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "-10"}),
            &["nvidia.com/gpucores", "must not be negative"],
        ),
        (
            "fractional memory",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1.5"}),
            &["nvidia.com/gpumem", "whole number"],
        ),
        (
            "fractional count",
            json!({"nvidia.com/gpu": "500m"}),
            &["nvidia.com/gpu", "whole number"],
        ),
        (
            "garbage quantity",
            json!({"nvidia.com/gpu": "one"}),
            &["nvidia.com/gpu", "not a valid quantity"],
        ),
        (
            "absurd memory",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4Gi"}),
            &["nvidia.com/gpumem", "between 1 and 16777216"],
        ),
        (
            "absurd count",
            json!({"nvidia.com/gpu": "1000"}),
            &["nvidia.com/gpu", "between 0 and 64"],
        ),
        (
            "zero memory",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}),
            &["nvidia.com/gpumem", "between 1 and"],
        ),
        (
            "percentage above 100",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"}),
            &["nvidia.com/gpumem-percentage", "between 1 and 100"],
        ),
        (
            "percentage zero",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}),
            &["nvidia.com/gpumem-percentage", "between 1 and 100"],
        ),
        (
            "zero gpus with memory",
            json!({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1000"}),
            &["nvidia.com/gpu", "is 0 but"],
        ),
        (
            "priority out of range",
            json!({"nvidia.com/gpu": "1", "nvidia.com/priority": "5"}),
            &["nvidia.com/priority", "between 0 and 1"],
        ),
    ];
    for (name, limits, needles) in cases {
        let err = parse(&one(limits)).expect_err(name).to_string();
        for needle in needles {
            assert!(err.contains(needle), "{name}: {err:?} lacks {needle:?}");
        }
    }
}

#[test]
fn every_violation_is_reported_not_just_the_first() {
    let pod = pod(
        json!([
            {"name": "a", "resources": {"limits": {"nvidia.com/gpucores": "101"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpumem": "1", "nvidia.com/gpumem-percentage": "1"}}},
        ]),
        json!({"nvidia.com/numa-bind": "yes", "hami.io/node-scheduler-policy": "random"}),
    );
    let Err(Error::InvalidPodRequest(Violations(found))) = parse(&pod) else {
        panic!("expected violations");
    };
    let fields: Vec<_> = found
        .iter()
        .map(|v| (v.container.as_deref(), v.field.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            (Some("a"), "nvidia.com/gpucores"),
            (Some("b"), "nvidia.com/gpumem"),
            (None, "nvidia.com/numa-bind"),
            (None, "hami.io/node-scheduler-policy"),
        ]
    );
}

#[test]
fn limits_win_over_requests_and_requests_fill_in() {
    let both = pod(
        json!([{"name": "c", "resources": {
            "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"},
            "requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "40"},
        }}]),
        json!({}),
    );
    assert_eq!(
        containers(&both),
        vec![req(1, MemoryRequest::Mib(2000), 40)]
    );
}

#[test]
fn pods_without_gpu_requests_are_none_and_their_annotations_are_ignored() {
    let plain = pod(
        json!([{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}, {"name": "d"}]),
        json!({"nvidia.com/numa-bind": "not-a-bool"}),
    );
    assert_eq!(parse(&plain).unwrap(), None);
    assert_eq!(parse(&one(json!({"nvidia.com/gpu": "0"}))).unwrap(), None);
    assert_eq!(parse(&Pod::default()).unwrap(), None);
}

#[test]
fn init_containers_and_sidecars_come_first_in_kubelet_order() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [
                {"name": "warmup", "resources": {"limits": {"nvidia.com/gpumem": "1000"}}},
                {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpumem": "500"}}},
                {"name": "no-gpu"},
            ],
            "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2000"}}},
            ],
        },
    }))
    .unwrap();
    let got: Vec<_> = containers(&pod)
        .into_iter()
        .map(|c| (c.name, c.kind, c.count))
        .collect();
    assert_eq!(
        got,
        [
            ("warmup".to_owned(), ContainerKind::Init, 1),
            ("proxy".to_owned(), ContainerKind::Sidecar, 1),
            ("main".to_owned(), ContainerKind::App, 2),
        ]
    );
}

#[test]
fn cluster_defaults_and_renamed_resources_apply() {
    let config = RequestConfig {
        resources: ResourceNames {
            count: "example.com/vgpu".into(),
            ..ResourceNames::default()
        },
        default_memory: 4096,
        default_cores: 25,
        default_gpu_num: 2,
        ..RequestConfig::default()
    };
    config.validate().unwrap();
    let only_cores = one(json!({"nvidia.com/gpucores": "10"}));
    let got = parse_pod(&only_cores, &config).unwrap().unwrap().containers;
    assert_eq!(got, vec![req(2, MemoryRequest::Mib(4096), 10)]);
    let renamed = one(json!({"example.com/vgpu": "1"}));
    let got = parse_pod(&renamed, &config).unwrap().unwrap().containers;
    assert_eq!(got, vec![req(1, MemoryRequest::Mib(4096), 25)]);
    // The default name is no longer a GPU request under this config.
    assert_eq!(
        parse_pod(&one(json!({"nvidia.com/gpu": "1"})), &config).unwrap(),
        None
    );
}

#[test]
fn config_validation_names_the_setting() {
    let cases = [
        (
            RequestConfig {
                default_gpu_num: 0,
                ..Default::default()
            },
            "defaultGPUNum",
        ),
        (
            RequestConfig {
                default_cores: 101,
                ..Default::default()
            },
            "defaultCores",
        ),
        (
            RequestConfig {
                default_memory: u64::MAX,
                ..Default::default()
            },
            "defaultMemory",
        ),
        (
            RequestConfig {
                resources: ResourceNames {
                    cores: "nvidia.com/gpumem".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
            "distinct",
        ),
        (
            RequestConfig {
                resources: ResourceNames {
                    count: "gpu".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
            "domain-qualified",
        ),
    ];
    for (config, needle) in cases {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
    let yaml: RequestConfig =
        serde_json::from_value(json!({"defaultMemory": 1000, "defaultGPUNum": 2})).unwrap();
    assert_eq!(yaml.default_gpu_num, 2);
    assert!(
        serde_json::from_value::<RequestConfig>(json!({"defaultMem": 1})).is_err(),
        "unknown keys are rejected"
    );
}

#[test]
fn annotations_parse_into_options() {
    let pod = pod(
        json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        json!({
            "nvidia.com/use-gputype": "A100, H100,",
            "nvidia.com/nouse-gputype": "T4",
            "nvidia.com/use-gpuuuid": "GPU-a,GPU-b",
            "nvidia.com/nouse-gpuuuid": "GPU-c",
            "nvidia.com/numa-bind": "True",
            "nvidia.com/vgpu-mode": "mig",
            "hami.io/gpu-scheduler-policy": "binpack",
            "hami.io/node-scheduler-policy": "Spread",
        }),
    );
    let options = parse(&pod).unwrap().unwrap().options;
    assert_eq!(
        options,
        PodOptions {
            // Types lowercased once, here; UUIDs as sets.
            use_gpu_types: vec!["a100".into(), "h100".into()],
            nouse_gpu_types: vec!["t4".into()],
            use_gpu_uuids: ["GPU-a".into(), "GPU-b".into()].into(),
            nouse_gpu_uuids: ["GPU-c".into()].into(),
            numa_bind: true,
            vgpu_mode: Some(OperatingMode::Mig),
            gpu_policy: Some(SchedulingPolicy::Binpack),
            mutex: Some(false),
            scoring_weights: ScoringWeights::default(),
            node_policy: Some(SchedulingPolicy::Spread),
        }
    );
}

/// HAMi's policy chains (`TestPolicyContains`): `mutex` is a filter beside
/// the sort key; the first of binpack and spread written orders the GPUs.
#[test]
fn gpu_policy_chains_and_weights_parse_into_options() {
    let options = |annotations: serde_json::Value| {
        parse(&pod(
            json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
            annotations,
        ))
        .unwrap()
        .unwrap()
        .options
    };
    for (policy, order, mutex) in [
        ("mutex", None, true),
        ("mutex,spread", Some(SchedulingPolicy::Spread), true),
        ("binpack, mutex", Some(SchedulingPolicy::Binpack), true),
        (" Mutex , binpack,", Some(SchedulingPolicy::Binpack), true),
        ("binpack,spread", Some(SchedulingPolicy::Binpack), false),
        ("spread", Some(SchedulingPolicy::Spread), false),
    ] {
        let got = options(json!({"hami.io/gpu-scheduler-policy": policy}));
        assert_eq!(
            (got.gpu_policy, got.mutex),
            (order, Some(mutex)),
            "{policy:?}"
        );
    }
    let weighted = options(json!({"hami.io/device-scoring-weights": "slot=1,core=1,memory=3"}));
    assert_eq!(
        weighted.scoring_weights,
        ScoringWeights {
            slot: 1,
            core: 1,
            memory: 3
        }
    );
    assert!(weighted.mutex.is_none() && weighted.gpu_policy.is_none());
}

#[test]
fn invalid_annotations_are_violations() {
    let cases = [
        ("nvidia.com/numa-bind", "1", "must be \"true\" or \"false\""),
        (
            "nvidia.com/vgpu-mode",
            "turbo",
            "must be hami-core, mig or mps",
        ),
        (
            "hami.io/gpu-scheduler-policy",
            "topology-aware",
            "must be a comma list of binpack, spread and mutex, got \"topology-aware\" (\"topology-aware\" is not one",
        ),
        (
            "hami.io/gpu-scheduler-policy",
            "spread,numa",
            "must be a comma list of binpack, spread and mutex, got \"spread,numa\" (\"numa\" is not one",
        ),
        (
            "hami.io/gpu-scheduler-policy",
            " , ",
            "must be a comma list of binpack, spread and mutex, got \" , \"",
        ),
        (
            "hami.io/device-scoring-weights",
            "slot=1,core=-1,memory=3",
            "invalid hami.io/device-scoring-weights annotation \"slot=1,core=-1,memory=3\": \"core\" weight must not be negative",
        ),
        (
            "hami.io/device-scoring-weights",
            "",
            "invalid hami.io/device-scoring-weights annotation \"\": expected slot, core, and memory weights",
        ),
    ];
    for (key, value, rule) in cases {
        let pod = pod(
            json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
            json!({key: value}),
        );
        let err = parse(&pod).unwrap_err().to_string();
        assert!(err.contains(&format!("annotation {key}: {rule}")), "{err}");
    }
    let both = pod(
        json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        json!({"nvidia.com/use-gpuuuid": "GPU-a", "nvidia.com/nouse-gpuuuid": "GPU-a"}),
    );
    assert!(
        parse(&both)
            .unwrap_err()
            .to_string()
            .contains("no GPU could satisfy both")
    );
}

#[test]
fn memory_requests_resolve_against_capacity() {
    assert_eq!(MemoryRequest::Percent(50).resolve(81920), 40960);
    assert_eq!(MemoryRequest::Percent(100).resolve(15360), 15360);
    assert_eq!(MemoryRequest::Mib(3000).resolve(81920), 3000);
}
