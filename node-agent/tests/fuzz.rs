//! Fuzz/property targets for what the node agent reads from outside: the
//! fake-GPU file and the kubelet's device-plugin requests (with the
//! NodeLock and VgpuAllocation they are answered from). See docs/fuzzing.md.
//!
//! Every target runs `PROPTEST_CASES` cases (its own default otherwise) and
//! prints how many it ran; `make fuzz` raises the count.

#![allow(missing_docs)]

use std::{fmt::Debug, path::Path, time::Instant};

use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use prost::Message;
use serde_json::{Value, json};
use tessera_api::{
    env,
    v1alpha1::{CorePolicy, FilterDevices, NodeLock, NodeSettings, VgpuAllocation},
};
use tessera_deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    PreStartContainerRequest, PreferredAllocationRequest,
};
use tessera_node_agent::{
    backend::{Backend, FakeBackend},
    plugin::{
        self, DeviceList, DeviceListStrategy, HostPaths, device_list, grant, preferred, replica_id,
        uuid_of,
    },
    settings::offered,
    sharing::hami_core,
};
use tessera_scheduling::request::MAX_MEMORY_MIB;

/// Runs `test` on `default_cases` inputs (or `PROPTEST_CASES`), printing the count and time.
fn fuzz<S>(
    name: &str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    if let Err(error) = runner.run(&strategy, test) {
        panic!("{name}: {error}");
    }
    eprintln!("{name}: {cases} cases in {:.2?}", started.elapsed());
}

// ---------------------------------------------------------------------------
// The fake-GPU file.

/// One field of a generated device: its YAML text and whether it is of the
/// wrong type (the decoder must refuse it, naming the field).
#[derive(Clone, Debug)]
struct Field {
    key: &'static str,
    yaml: String,
    wrong_type: bool,
}

fn number_field(
    key: &'static str,
    valid: BoxedStrategy<String>,
) -> impl Strategy<Value = Option<Field>> {
    let wrong = prop_oneof![
        Just("[]".to_owned()),
        Just("{a: 1}".to_owned()),
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("'x'".to_owned()),
    ];
    proptest::option::weighted(
        0.95,
        prop_oneof![
            6 => valid.prop_map(move |yaml| Field { key, yaml, wrong_type: false }),
            // An empty list is a fine value for a list field.
            1 => wrong
                .prop_filter("valid for this field", move |w| !(key == "nvlinkPeers" && w == "[]"))
                .prop_map(move |yaml| Field { key, yaml, wrong_type: true }),
        ],
    )
}

fn string_field(
    key: &'static str,
    valid: BoxedStrategy<String>,
) -> impl Strategy<Value = Option<Field>> {
    proptest::option::weighted(
        0.95,
        prop_oneof![
            6 => valid.prop_map(move |s| Field { key, yaml: serde_json::to_string(&s).unwrap(), wrong_type: false }),
            1 => prop_oneof![Just("[a]"), Just("{b: c}")].prop_map(move |y| Field { key, yaml: y.to_owned(), wrong_type: true }),
        ],
    )
}

#[derive(Clone, Debug)]
struct GenDevice {
    fields: Vec<Field>,
    unknown: Option<String>,
}

fn gen_device() -> impl Strategy<Value = GenDevice> {
    let uuid = prop_oneof![4 => "GPU-[a-d]", 1 => "\\PC{0,8}", 1 => "gpu-[a-d]"].boxed();
    let index = prop_oneof![0u32..8, any::<u32>()]
        .prop_map(|n| n.to_string())
        .boxed();
    let memory = prop_oneof![Just(0u64), 1u64..200_000, Just(u64::MAX), any::<u64>()]
        .prop_map(|n| n.to_string())
        .boxed();
    let numa = prop_oneof![
        Just("null".to_owned()),
        (0u32..4).prop_map(|n| n.to_string())
    ]
    .boxed();
    let health = prop_oneof![Just("Healthy"), Just("Unhealthy")]
        .prop_map(str::to_owned)
        .boxed();
    let model = "\\PC{0,20}".boxed();
    let peers = proptest::collection::vec("GPU-[a-d]", 0..3)
        .prop_map(|v| serde_json::to_string(&v).unwrap())
        .boxed();
    (
        string_field("uuid", uuid),
        number_field("index", index),
        string_field("model", model),
        number_field("memoryMiB", memory),
        number_field("numaNode", numa),
        number_field("nvlinkPeers", peers),
        proptest::option::of(prop_oneof![
            4 => health.prop_map(|h| Field { key: "health", yaml: h, wrong_type: false }),
            1 => Just(Field { key: "health", yaml: "Sick".into(), wrong_type: true }),
        ]),
        proptest::option::weighted(0.1, prop_oneof![Just("colour".to_owned()), "[a-z]{1,8}"]),
    )
        .prop_map(|(a, b, c, d, e, f, g, unknown)| GenDevice {
            fields: [a, b, c, d, e, f, g].into_iter().flatten().collect(),
            unknown: unknown.filter(|u| {
                ![
                    "uuid",
                    "index",
                    "model",
                    "memoryMiB",
                    "numaNode",
                    "nvlinkPeers",
                    "health",
                    "healthMessage",
                ]
                .contains(&u.as_str())
            }),
        })
}

fn device_yaml(d: &GenDevice) -> String {
    let mut parts: Vec<String> = d
        .fields
        .iter()
        .map(|f| format!("{}: {}", f.key, f.yaml))
        .collect();
    if let Some(unknown) = &d.unknown {
        parts.push(format!("{unknown}: 1"));
    }
    format!("- {{{}}}\n", parts.join(", "))
}

/// The first problem the reader must name, in the order it reads: types and
/// unknown fields in document order, missing fields at the end of a device,
/// then the checks on the decoded devices.
fn first_problem(devices: &[GenDevice]) -> Option<String> {
    for d in devices {
        if let Some(f) = d.fields.iter().find(|f| f.wrong_type) {
            return Some(f.key.to_owned());
        }
        if let Some(unknown) = &d.unknown {
            return Some(unknown.clone());
        }
        for required in ["uuid", "index", "model", "memoryMiB"] {
            if !d.fields.iter().any(|f| f.key == required) {
                return Some(required.to_owned());
            }
        }
    }
    let value = |d: &GenDevice, key: &str| {
        d.fields
            .iter()
            .find(|f| f.key == key)
            .map(|f| f.yaml.clone())
    };
    let mut seen = std::collections::BTreeSet::new();
    for d in devices {
        let uuid: String = serde_json::from_str(&value(d, "uuid").unwrap()).unwrap();
        if !uuid.starts_with("GPU-") {
            return Some("uuid".into());
        }
        if !seen.insert(uuid) {
            return Some("appears twice".into());
        }
        if value(d, "memoryMiB").as_deref() == Some("0") {
            return Some("memoryMiB".into());
        }
    }
    None
}

fn settings() -> impl Strategy<Value = NodeSettings> {
    (
        1u32..=100,
        prop_oneof![Just(1.0), 0.01f64..=100.0],
        prop_oneof![Just(1.0), 0.01f64..=100.0],
        proptest::collection::vec("GPU-[a-d]", 0..2),
        proptest::collection::vec(0u32..4, 0..2),
        0u8..=4,
        prop_oneof![
            Just(CorePolicy::Default),
            Just(CorePolicy::Force),
            Just(CorePolicy::Disable)
        ],
    )
        .prop_map(
            |(split, mem, core, uuids, indexes, log, policy)| NodeSettings {
                device_split_count: split,
                device_memory_scaling: mem,
                device_core_scaling: core,
                filter_devices: FilterDevices { uuids, indexes },
                lib_cuda_log_level: log,
                gpu_core_policy: policy,
                ..NodeSettings::default()
            },
        )
}

#[test]
fn fuzz_fake_gpu_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpus.yaml");
    let file = prop_oneof![
        4 => proptest::collection::vec(gen_device(), 0..5).prop_map(|d| {
            let text = if d.is_empty() {
                "devices: []\n".to_owned()
            } else {
                format!("devices:\n{}", d.iter().map(device_yaml).collect::<String>())
            };
            (Some(d), text)
        }),
        1 => any::<String>().prop_map(|t| (None, t)),
        1 => "(devices|gpus|[a-z]{1,4}):( |\n- )\\PC{0,30}".prop_map(|t| (None, t)),
        // Anchors and aliases: a "billion laughs" file must be refused, not expanded.
        1 => (1usize..12).prop_map(|n| {
            let mut text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned();
            for i in 1..n {
                let prev = format!("*a{}", i - 1);
                text.push_str(&format!("a{i}: &a{i} [{}]\n", vec![prev; 10].join(", ")));
            }
            text.push_str(&format!("devices: *a{}\n", n - 1));
            (None, text)
        }),
    ];
    fuzz(
        "fuzz_fake_gpu_file",
        500,
        (file, settings()),
        |((generated, text), settings)| {
            std::fs::write(&path, &text).unwrap();
            let result = FakeBackend::new(&path, path.with_extension("mig.json")).devices();
            match (&result, generated.as_deref().map(first_problem)) {
                (Err(error), expected) => {
                    let message = error.to_string();
                    prop_assert!(message.contains("gpus.yaml"), "{message}");
                    prop_assert!(message.len() <= 4 * text.len() + 512, "{message}");
                    if let Some(expected) = expected {
                        let expected =
                            expected.unwrap_or_else(|| panic!("refused a valid file: {message}"));
                        prop_assert!(
                            message.contains(&expected),
                            "{expected} not named: {message}"
                        );
                    }
                }
                (Ok(_), Some(Some(problem))) => {
                    return Err(TestCaseError::fail(format!(
                        "accepted a file whose {problem} is wrong"
                    )));
                }
                (Ok(devices), _) => {
                    prop_assert!(devices.len() <= text.len() / 8 + 1);
                    // What the agent then offers and lists for the kubelet.
                    let offer = offered(devices, &settings, &Default::default());
                    prop_assert!(offer.len() <= devices.len());
                    let listed = device_list(&offer);
                    prop_assert_eq!(
                        listed.len(),
                        offer.len() * settings.device_split_count as usize
                    );
                    for d in &offer {
                        prop_assert!(!settings.filter_devices.uuids.contains(&d.uuid));
                        prop_assert!(!settings.filter_devices.indexes.contains(&d.index));
                    }
                    for id in &listed {
                        prop_assert!(offer.iter().any(|d| d.uuid == uuid_of(&id.id)));
                    }
                }
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------
// Device-plugin requests.

#[derive(Clone, Debug)]
struct World {
    lock: Option<Value>,
    allocation: Option<Value>,
    /// The allocation holds what a real scheduler writes (the contract).
    in_contract: bool,
}

const NODE: &str = "node-1";

fn world() -> impl Strategy<Value = World> {
    let uid = prop_oneof![
        6 => Just("uid-1".to_owned()),
        1 => "[a-f0-9-]{1,36}",
        1 => prop_oneof![Just("../../etc".to_owned()), Just("/etc".to_owned()), Just("a/b".to_owned()), Just("..".to_owned())],
        1 => "\\PC{1,10}",
    ];
    let name = prop_oneof![
        6 => "[a-z][a-z0-9-]{0,6}",
        1 => prop_oneof![Just("../x".to_owned()), Just("/".to_owned()), Just("..".to_owned())],
        1 => "\\PC{0,6}",
    ];
    let slice = (
        "GPU-[a-d]",
        prop_oneof![3 => 1u64..=MAX_MEMORY_MIB, 1 => any::<u64>()],
        prop_oneof![3 => 0u32..=100, 1 => any::<u32>()],
    );
    let container = (
        name,
        proptest::collection::vec(slice, 0..4),
        proptest::option::of(prop_oneof![3 => 0u32..=1, 1 => any::<u32>()]),
    );
    (
        uid.clone(),
        prop_oneof![4 => Just(NODE.to_owned()), 1 => "[a-z-]{0,8}"],
        proptest::collection::vec(container, 0..4),
        proptest::collection::vec(any::<usize>(), 0..3),
        any::<bool>(),
        prop_oneof![4 => Just(None), 1 => uid.prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(|(uid, node, containers, served, has_lock, other_uid, has_allocation)| {
            let in_contract = uid == "uid-1"
                && containers.iter().all(|(name, devices, priority)| {
                    name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !name.is_empty()
                        && priority.is_none_or(|p| p <= 1)
                        && devices.iter().all(|(_, mib, cores)| (1..=MAX_MEMORY_MIB).contains(mib) && *cores <= 100)
                });
            let served: Vec<String> = served
                .iter()
                .filter_map(|i| containers.get(i % containers.len().max(1)).map(|c| c.0.clone()))
                .collect();
            let containers: Vec<Value> = containers
                .iter()
                .map(|(name, devices, priority)| {
                    let devices: Vec<Value> = devices
                        .iter()
                        .map(|(uuid, mib, cores)| json!({"uuid": uuid, "index": 0, "model": "m", "memoryMiB": mib, "cores": cores}))
                        .collect();
                    json!({"name": name, "devices": devices, "priority": priority})
                })
                .collect();
            let allocation = json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "VgpuAllocation",
                "metadata": {"name": "train", "namespace": "ml"},
                "spec": {
                    "podName": "train", "podUid": uid, "nodeName": node, "containers": containers,
                    "gpuPolicy": "spread", "nodePolicy": "binpack",
                    "totals": {"devices": "", "memoryMiB": 0, "cores": 0},
                },
                "status": {"servedContainers": served},
            });
            let lock = json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "NodeLock",
                "metadata": {"name": NODE},
                "spec": {
                    "holder": {"namespace": "ml", "name": "train", "uid": other_uid.unwrap_or(uid)},
                    "allocation": "train", "acquiredAt": "2026-01-01T00:00:00Z",
                    "ttlSeconds": 60, "expiresAt": "2026-01-01T00:01:00Z",
                },
            });
            World {
                lock: has_lock.then_some(lock),
                allocation: has_allocation.then_some(allocation),
                in_contract,
            }
        })
}

/// Device IDs as the kubelet sends them: replicas of the allocation's GPUs, and anything else.
fn device_ids() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(
        prop_oneof![
            4 => ("GPU-[a-d]", 0u32..10).prop_map(|(u, r)| replica_id(&u, r)),
            1 => "\\PC{0,12}",
            1 => Just("::".to_owned()),
        ],
        0..5,
    )
}

/// A request as bytes on the wire: a structured one encoded, or arbitrary bytes.
fn wire<M: Message + Default + Debug + 'static>(
    structured: impl Strategy<Value = M> + 'static,
) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => structured.prop_map(|m| m.encode_to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 0..256),
    ]
}

fn list() -> impl Strategy<Value = DeviceList> {
    proptest::sample::subsequence(
        vec![
            DeviceListStrategy::Envvar,
            DeviceListStrategy::CdiCri,
            DeviceListStrategy::CdiAnnotations,
        ],
        0..=3,
    )
    .prop_map(|strategies| DeviceList {
        strategies,
        ..DeviceList::default()
    })
}

#[test]
fn fuzz_allocate_request() {
    let request = wire(proptest::collection::vec(device_ids(), 0..4).prop_map(|c| {
        AllocateRequest {
            container_requests: c
                .into_iter()
                .map(|devices_ids| ContainerAllocateRequest { devices_ids })
                .collect(),
        }
    }));
    let paths = HostPaths {
        library: "/opt/tessera/libtessera_vgpu.so".into(),
        preload: "/var/lib/tessera/ld.so.preload".into(),
        regions: "/var/lib/tessera/containers".into(),
        limits: "/var/lib/tessera/limits".into(),
    };
    fuzz(
        "fuzz_allocate_request",
        1000,
        (world(), request, settings(), list()),
        |(world, bytes, settings, list)| {
            // What tonic hands the service: the decoded message, or a decode error.
            let Ok(request) = AllocateRequest::decode(bytes.as_slice()) else {
                return Ok(());
            };
            prop_assert!(request.encoded_len() <= bytes.len());
            let lock: Option<NodeLock> = world
                .lock
                .clone()
                .map(|v| serde_json::from_value(v).unwrap());
            let allocation: Option<VgpuAllocation> = world
                .allocation
                .clone()
                .map(|v| serde_json::from_value(v).unwrap());
            for container in &request.container_requests {
                let requested = &container.devices_ids;
                let result = grant(NODE, lock.as_ref(), allocation.as_ref(), requested, &paths);
                let input =
                    bytes.len() + world.allocation.as_ref().map_or(0, |a| a.to_string().len());
                let output = format!("{result:?}").len();
                prop_assert!(
                    output <= 64 * input + 4096,
                    "{output} bytes out for {input} in"
                );
                let grant = match result {
                    Err(error) => {
                        // Each refusal says which node or pod it is about.
                        let message = error.to_string();
                        prop_assert!(
                            message.contains(NODE) || message.contains("ml/train"),
                            "{message}"
                        );
                        continue;
                    }
                    Ok(grant) => grant,
                };
                let (lock, allocation) = (lock.as_ref().unwrap(), allocation.as_ref().unwrap());
                prop_assert_eq!(&allocation.spec.pod_uid, &lock.spec.holder.uid);
                prop_assert_eq!(grant.slices.len(), requested.len());
                // What the device plugin answers for it, in hami-core.
                let contract = hami_core::contract(&grant.to_serve(&settings), &paths);
                let answer = plugin::answer(contract, &list, &grant.pod_uid);
                let served = allocation
                    .status
                    .as_ref()
                    .map(|s| s.served_containers.clone())
                    .unwrap_or_default();
                let container = allocation
                    .spec
                    .containers
                    .iter()
                    .find(|c| !c.devices.is_empty() && !served.contains(&c.name))
                    .unwrap();
                prop_assert_eq!(&grant.container, &container.name);
                // The region directory is one directory under the regions root,
                // whatever the allocation names the pod and container.
                prop_assert_eq!(
                    grant.region_dir.parent(),
                    Some(paths.regions.as_path()),
                    "{:?}",
                    grant.region_dir
                );
                prop_assert!(answer.mounts.iter().all(|m| m.host_path.starts_with('/')));
                // An allocation a real scheduler wrote gives an environment the
                // interposer accepts: the agent never writes a value its own
                // interposer would refuse.
                if world.in_contract {
                    for (i, device) in container.devices.iter().enumerate() {
                        let name = env::memory_limit_var(i);
                        let value = &answer.envs[&name];
                        prop_assert_eq!(
                            env::parse_memory_limit(&name, value).unwrap(),
                            device.memory_mib << 20
                        );
                    }
                    prop_assert!(
                        env::parse_sm_limit(&answer.envs[env::CUDA_DEVICE_SM_LIMIT]).is_ok()
                    );
                    prop_assert!(
                        env::CoreUtilizationPolicy::parse(
                            &answer.envs[env::GPU_CORE_UTILIZATION_POLICY]
                        )
                        .is_ok()
                    );
                    prop_assert!(
                        env::parse_log_level(&answer.envs[env::LIBCUDA_LOG_LEVEL]).is_ok()
                    );
                    if let Some(p) = answer.envs.get(env::CUDA_TASK_PRIORITY) {
                        prop_assert!(p == "0" || p == "1", "{p}");
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_preferred_allocation_request() {
    let request = wire(
        proptest::collection::vec(
            (
                device_ids(),
                device_ids(),
                prop_oneof![0i32..6, any::<i32>()],
            ),
            0..4,
        )
        .prop_map(|c| PreferredAllocationRequest {
            container_requests: c
                .into_iter()
                .map(
                    |(available, must, size)| ContainerPreferredAllocationRequest {
                        available_device_i_ds: available,
                        must_include_device_i_ds: must,
                        allocation_size: size,
                    },
                )
                .collect(),
        }),
    );
    fuzz(
        "fuzz_preferred_allocation_request",
        1000,
        (world(), request),
        |(world, bytes)| {
            let Ok(request) = PreferredAllocationRequest::decode(bytes.as_slice()) else {
                return Ok(());
            };
            prop_assert!(request.encoded_len() <= bytes.len());
            let lock: Option<NodeLock> = world.lock.map(|v| serde_json::from_value(v).unwrap());
            let allocation: Option<VgpuAllocation> =
                world.allocation.map(|v| serde_json::from_value(v).unwrap());
            for c in &request.container_requests {
                // As the service does: a negative size is 0.
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let answer = preferred(
                    lock.as_ref(),
                    allocation.as_ref(),
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    size,
                );
                if let Some(ids) = answer {
                    prop_assert_eq!(ids.len(), size);
                    for id in &ids {
                        prop_assert!(
                            c.available_device_i_ds.contains(id)
                                || c.must_include_device_i_ds.contains(id),
                            "{id}"
                        );
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_device_plugin_wire() {
    // Every request type the kubelet sends decodes from any bytes without
    // a panic, and never to more than it was sent.
    fuzz(
        "fuzz_device_plugin_wire",
        2000,
        proptest::collection::vec(any::<u8>(), 0..1024),
        |bytes| {
            if let Ok(m) = AllocateRequest::decode(bytes.as_slice()) {
                prop_assert!(m.encoded_len() <= bytes.len());
            }
            if let Ok(m) = PreferredAllocationRequest::decode(bytes.as_slice()) {
                prop_assert!(m.encoded_len() <= bytes.len());
            }
            if let Ok(m) = PreStartContainerRequest::decode(bytes.as_slice()) {
                prop_assert!(m.encoded_len() <= bytes.len());
            }
            Ok(())
        },
    );
}

/// Fixed corpus: inputs the targets found, kept as plain cases.
#[test]
fn fuzz_corpus_allocate_region_dir_stays_under_the_root() {
    let paths = HostPaths {
        library: "/l".into(),
        preload: "/p".into(),
        regions: "/var/lib/tessera/containers".into(),
        limits: "/var/lib/tessera/limits".into(),
    };
    for (uid, container) in [
        ("../../etc", "a"),
        ("/etc", "a"),
        ("uid-1", "../x"),
        ("a/b", "c"),
    ] {
        let allocation: VgpuAllocation = serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "VgpuAllocation",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {
                "podName": "train", "podUid": uid, "nodeName": NODE,
                "containers": [{"name": container, "devices": [{"uuid": "GPU-a", "index": 0, "model": "m", "memoryMiB": 1, "cores": 0}]}],
                "gpuPolicy": "spread", "nodePolicy": "binpack",
                "totals": {"devices": "", "memoryMiB": 0, "cores": 0},
            },
        }))
        .unwrap();
        let lock: NodeLock = serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "NodeLock", "metadata": {"name": NODE},
            "spec": {
                "holder": {"namespace": "ml", "name": "train", "uid": uid}, "allocation": "train",
                "acquiredAt": "2026-01-01T00:00:00Z", "ttlSeconds": 60, "expiresAt": "2026-01-01T00:01:00Z",
            },
        }))
        .unwrap();
        let requested = vec![replica_id("GPU-a", 0)];
        let error = grant(NODE, Some(&lock), Some(&allocation), &requested, &paths)
            .unwrap_err()
            .to_string();
        assert!(error.contains("ml/train") && error.contains(uid), "{error}");
    }
}

// ---------------------------------------------------------------------------
// DRA: a claim's allocation results, and the CDI spec made from them.

/// A quantity as the scheduler writes one, or hostile text.
fn quantity() -> BoxedStrategy<String> {
    prop_oneof![
        (0u64..200_000).prop_map(|mib| format!("{mib}Mi")),
        (0u64..=100).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just("-1".to_owned()),
        Just("1e400".to_owned()),
        Just("18446744073709551616Ki".to_owned()),
        Just("0.5".to_owned()),
        "\\PC{0,12}",
    ]
    .boxed()
}

/// One allocation result: mostly ours, on this node's devices; sometimes
/// another driver's or pool's, a device not offered, or hostile names.
fn claim_result() -> impl Strategy<Value = Value> {
    let driver = prop_oneof![
        4 => Just(tessera_node_agent::dra::DRIVER.to_owned()),
        1 => Just("other.example.com".to_owned()),
        1 => "\\PC{0,10}",
    ];
    let pool = prop_oneof![4 => Just("node-a".to_owned()), 1 => Just("node-b".to_owned()), 1 => "\\PC{0,10}"];
    let device = prop_oneof![
        4 => (0u32..4).prop_map(|i| format!("gpu-{i}")),
        1 => Just("gpu-99".to_owned()),
        1 => "\\PC{0,10}",
    ];
    let request = prop_oneof![
        4 => prop::sample::select(vec!["train", "infer", "main/small", "main/large"]).prop_map(str::to_owned),
        1 => Just("../../etc".to_owned()),
        1 => Just("a/../../b".to_owned()),
        1 => "\\PC{0,16}",
    ];
    let consumed = prop::option::of((prop::option::of(quantity()), prop::option::of(quantity())));
    (
        driver,
        pool,
        device,
        request,
        consumed,
        prop::option::of("[a-z0-9-]{0,12}"),
    )
        .prop_map(|(driver, pool, device, request, consumed, share)| {
            let mut result =
                json!({"driver": driver, "pool": pool, "device": device, "request": request});
            if let Some((memory, cores)) = consumed {
                let mut capacity = serde_json::Map::new();
                if let Some(m) = memory {
                    capacity.insert("memory".into(), m.into());
                }
                if let Some(c) = cores {
                    capacity.insert("cores".into(), c.into());
                }
                result["consumedCapacity"] = Value::Object(capacity);
            }
            if let Some(share) = share {
                result["shareID"] = share.into();
            }
            result
        })
}

#[test]
fn fuzz_claim_results() {
    use tessera_node_agent::dra::{cdi_spec, claim_gpus};
    let offer: Vec<_> = (0..4)
        .map(|i| tessera_api::testing::gpu(i, tessera_api::testing::MODEL, 81920))
        .collect();
    let paths = HostPaths {
        library: "/opt/tessera/libtessera_vgpu.so".into(),
        preload: "/var/lib/tessera/ld.so.preload".into(),
        regions: "/var/lib/tessera/containers".into(),
        limits: "/var/lib/tessera/limits".into(),
    };
    let uid = "0b6f4c8e-5d2a-4f7e-9a3b-1c2d3e4f5a6b";
    let claims = (
        prop::collection::vec(claim_result(), 0..6),
        prop::option::of(any::<u8>()),
    )
        .prop_map(|(results, swap)| {
            let mut claim = json!({
                "metadata": {"name": "c", "namespace": "ml", "uid": uid},
                "spec": {},
                "status": {"allocation": {"devices": {"results": results}}},
            });
            // Now and then a result of the wrong shape.
            if let Some(n) = swap
                && let Some(list) =
                    claim["status"]["allocation"]["devices"]["results"].as_array_mut()
                && !list.is_empty()
            {
                let at = usize::from(n) % list.len();
                list[at] = json!({"driver": n, "pool": [], "device": null});
            }
            claim
        });
    fuzz("fuzz_claim_results", 1_000, claims, |claim| {
        let input = claim.to_string().len();
        let Ok(claim) =
            serde_json::from_value::<k8s_openapi::api::resource::v1::ResourceClaim>(claim)
        else {
            return Ok(());
        };
        let gpus = match claim_gpus(&claim, "node-a", &offer) {
            Ok(gpus) => gpus,
            Err(error) => {
                let text = error.to_string();
                prop_assert!(text.contains("ml/c"), "the error names the claim: {text}");
                prop_assert!(text.len() <= 4 * input + 1024, "{text}");
                return Ok(());
            }
        };
        prop_assert!(!gpus.is_empty());
        for gpu in &gpus {
            let offered = offer.iter().find(|d| d.uuid == gpu.uuid);
            let offered_as = offered.map(|d| format!("gpu-{}", d.index));
            prop_assert_eq!(offered_as.as_deref(), Some(gpu.device.as_str()));
            prop_assert!(gpu.cores <= 100);
            // What the agent writes the interposer reads back exactly.
            let text = env::format_memory_limit(gpu.memory_mib);
            prop_assert!(
                gpu.memory_mib >= 1
                    && gpu.memory_mib <= offered.map_or(0, |d| d.capacity.memory_mib)
            );
            prop_assert_eq!(
                env::parse_memory_limit("CUDA_DEVICE_MEMORY_LIMIT", &text).ok(),
                gpu.memory_mib.checked_mul(1 << 20)
            );
        }
        let spec = cdi_spec(uid, &gpus, &NodeSettings::default(), &paths);
        prop_assert!(spec.to_string().len() <= 64 * input + 4096);
        for device in spec["devices"].as_array().into_iter().flatten() {
            let name = device["name"].as_str().unwrap_or_default();
            // A CDI device name: letters, digits, `_`, `.`, `:`, `-`.
            prop_assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c)),
                "CDI device name {name:?}"
            );
            for mount in device["containerEdits"]["mounts"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let host = Path::new(mount["hostPath"].as_str().unwrap_or_default());
                if let Ok(rest) = host
                    .strip_prefix(&paths.regions)
                    .or_else(|_| host.strip_prefix(&paths.limits))
                {
                    prop_assert_eq!(
                        rest.components().count(),
                        1,
                        "region or limits directory {:?} is one directory under its root",
                        host
                    );
                    prop_assert!(matches!(
                        rest.components().next(),
                        Some(std::path::Component::Normal(_))
                    ));
                }
            }
        }
        Ok(())
    });
}
