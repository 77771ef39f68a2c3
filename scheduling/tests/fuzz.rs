//! Fuzz/property targets for the inputs parsed on behalf of every
//! component: a pod's GPU request (quantities, annotations; this crate),
//! and `tessera-api`'s GpuNodeConfig specs and the interposer's environment
//! values. See docs/fuzzing.md.
//!
//! Every target runs `PROPTEST_CASES` cases (its own default otherwise) and
//! prints how many it ran; `make fuzz` raises the count.

#![allow(missing_docs)]

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    time::Instant,
};

use k8s_openapi::api::core::v1::Pod;
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use serde_json::{Value, json};
use tessera_api::{
    env,
    names::annotations as keys,
    node_config::{glob_matches, resolve},
    v1alpha1::{GpuNodeConfig, NodeSettings, OperatingMode, SchedulingPolicy},
};
use tessera_scheduling::request::{
    ContainerKind, ContainerRequest, MAX_GPUS_PER_CONTAINER, MAX_LIST_BYTES, MAX_LIST_ENTRIES,
    MAX_LIST_ENTRY_BYTES, MAX_MEMORY_MIB, MemoryRequest, RequestConfig, parse_pod,
};

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

/// Output must grow at most linearly with the input: a generous constant
/// factor (Debug escapes a control character as up to 10 bytes, and a
/// container's name is repeated in each of its violations), but no blow-up.
fn bounded(what: &str, output: usize, input: usize) -> Result<(), TestCaseError> {
    prop_assert!(
        output <= 64 * input + 4096,
        "{what}: {output} bytes of output for {input} bytes of input"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Pod requests: quantities and annotations.

/// A quantity as written in a pod: either a known whole number in one of
/// Kubernetes' spellings, or hostile text.
#[derive(Clone, Debug)]
enum Q {
    Whole(u64, String),
    Text(String),
}

impl Q {
    fn text(&self) -> &str {
        match self {
            Q::Whole(_, text) | Q::Text(text) => text,
        }
    }
}

/// `n` in one of the spellings Kubernetes allows for a whole number.
fn spell(n: u64, form: u8) -> String {
    match form % 7 {
        1 => format!("+{n}"),
        2 if n <= u64::MAX / 1000 => format!("{}m", n * 1000),
        3 if n.is_multiple_of(1000) && n > 0 => format!("{}k", n / 1000),
        4 if n.is_multiple_of(1024) && n > 0 => format!("{}Ki", n / 1024),
        5 => format!("{n}e0"),
        6 if n.is_multiple_of(10) && n > 0 => format!("{}e1", n / 10),
        _ => n.to_string(),
    }
}

fn quantity() -> impl Strategy<Value = Q> {
    // The bounds of every rule, and either side of them.
    let edges = proptest::sample::select(&[0u64, 1, 2, 63, 64, 65, 99, 100, 101, 1000, 3072][..]);
    let small = prop_oneof![2 => edges, 1 => 0u64..=3, 1 => 0u64..=110, 1 => 0u64..=4096];
    let whole = (
        prop_oneof![4 => small, 1 => any::<u64>(), 1 => Just(MAX_MEMORY_MIB), 1 => Just(MAX_MEMORY_MIB + 1)],
        any::<u8>(),
    )
        .prop_map(|(n, form)| Q::Whole(n, spell(n, form)));
    let text = prop_oneof![
        "[-+]?[0-9]{0,25}(\\.[0-9]{0,12})?([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]{1,5})?",
        "-[0-9]{1,4}",
        "[0-9]{1,3}\\.[0-9]{1,3}",
        "\\PC{0,12}",
        any::<String>(),
        Just(String::new()),
        Just("1e9999".to_owned()),
        Just("0.000000000000000000000000000000000000000001e42".to_owned()),
    ]
    .prop_map(Q::Text);
    prop_oneof![3 => whole, 2 => text]
}

/// One container's GPU resources; each value goes in limits or in requests.
#[derive(Clone, Debug)]
struct GenContainer {
    name: String,
    kind: ContainerKind,
    count: Option<(Q, bool)>,
    memory: Option<(Q, bool)>,
    percentage: Option<(Q, bool)>,
    cores: Option<(Q, bool)>,
    priority: Option<(Q, bool)>,
    cpu: bool,
}

fn field() -> impl Strategy<Value = Option<(Q, bool)>> {
    proptest::option::weighted(0.5, (quantity(), any::<bool>()))
}

fn container() -> impl Strategy<Value = GenContainer> {
    (
        prop_oneof!["[a-z][a-z0-9-]{0,8}", "\\PC{0,6}"],
        prop_oneof![
            Just(ContainerKind::App),
            Just(ContainerKind::Init),
            Just(ContainerKind::Sidecar)
        ],
        (field(), field(), field(), field(), field()),
        any::<bool>(),
    )
        .prop_map(
            |(name, kind, (count, memory, percentage, cores, priority), cpu)| GenContainer {
                name,
                kind,
                count,
                memory,
                percentage,
                cores,
                priority,
                cpu,
            },
        )
}

fn annotation_value(valid: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
    proptest::option::weighted(
        0.4,
        prop_oneof![
            3 => proptest::sample::select(valid).prop_map(str::to_owned),
            1 => "\\PC{0,10}",
            1 => any::<String>(),
        ],
    )
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let uuids: &'static [&'static str] = &["GPU-a", "GPU-b", " GPU-a ,GPU-c", ",,", "GPU-b,GPU-d"];
    let types: &'static [&'static str] = &["A100", "a100,H100", "", " , T4 ,"];
    (
        annotation_value(types),
        annotation_value(types),
        annotation_value(uuids),
        annotation_value(uuids),
        annotation_value(&["true", "false", "TRUE", "False", "yes", ""]),
        annotation_value(&["hami-core", "mig", "mps", "MIG", "hami"]),
        annotation_value(&["binpack", "spread", " Spread ", "BINPACK", "random"]),
        annotation_value(&["binpack", "spread", "Binpack", "first-fit"]),
        proptest::option::weighted(0.3, ("\\PC{0,12}", "\\PC{0,12}")),
    )
        .prop_map(|(ut, nt, uu, nu, numa, mode, gp, np, other)| {
            let mut map = BTreeMap::new();
            for (key, value) in [
                (keys::USE_GPU_TYPE, ut),
                (keys::NOUSE_GPU_TYPE, nt),
                (keys::USE_GPU_UUID, uu),
                (keys::NOUSE_GPU_UUID, nu),
                (keys::NUMA_BIND, numa),
                (keys::VGPU_MODE, mode),
                (keys::GPU_SCHEDULER_POLICY, gp),
                (keys::NODE_SCHEDULER_POLICY, np),
            ] {
                if let Some(value) = value {
                    map.insert(key.to_owned(), value);
                }
            }
            if let Some((k, v)) = other {
                map.insert(k, v);
            }
            map
        })
}

/// Valid cluster defaults (what `RequestConfig::validate` accepts).
fn request_config() -> impl Strategy<Value = RequestConfig> {
    prop_oneof![
        Just(RequestConfig::default()),
        (
            0u64..=MAX_MEMORY_MIB,
            0u32..=100,
            1u32..=MAX_GPUS_PER_CONTAINER
        )
            .prop_map(|(m, c, n)| RequestConfig {
                default_memory: m,
                default_cores: c,
                default_gpu_num: n,
                ..RequestConfig::default()
            }),
    ]
}

#[derive(Clone, Debug)]
struct GenPod {
    containers: Vec<GenContainer>,
    annotations: BTreeMap<String, String>,
    config: RequestConfig,
}

fn gen_pod() -> impl Strategy<Value = GenPod> {
    (
        proptest::collection::vec(container(), 0..5),
        annotations(),
        request_config(),
    )
        .prop_map(|(mut containers, annotations, config)| {
            // Container names are unique within a pod (the API server checks).
            let mut seen = BTreeSet::new();
            for (i, c) in containers.iter_mut().enumerate() {
                if !seen.insert(c.name.clone()) {
                    c.name = format!("{}-{i}", c.name);
                    seen.insert(c.name.clone());
                }
            }
            GenPod {
                containers,
                annotations,
                config,
            }
        })
}

fn pod_json(pod: &GenPod) -> Value {
    let names = &pod.config.resources;
    let container = |c: &GenContainer| {
        let mut limits = serde_json::Map::new();
        let mut requests = serde_json::Map::new();
        for (key, value) in [
            (&names.count, &c.count),
            (&names.memory, &c.memory),
            (&names.memory_percentage, &c.percentage),
            (&names.cores, &c.cores),
            (&names.priority, &c.priority),
        ] {
            if let Some((q, in_limits)) = value {
                let map = if *in_limits {
                    &mut limits
                } else {
                    &mut requests
                };
                map.insert(key.clone(), json!(q.text()));
            }
        }
        if c.cpu {
            limits.insert("cpu".into(), json!("500m"));
        }
        let mut out = json!({"name": c.name, "image": "x", "resources": {"limits": limits, "requests": requests}});
        if c.kind == ContainerKind::Sidecar {
            out["restartPolicy"] = json!("Always");
        }
        out
    };
    let init: Vec<Value> = pod
        .containers
        .iter()
        .filter(|c| c.kind != ContainerKind::App)
        .map(container)
        .collect();
    let app: Vec<Value> = pod
        .containers
        .iter()
        .filter(|c| c.kind == ContainerKind::App)
        .map(container)
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "annotations": pod.annotations},
        "spec": {"initContainers": init, "containers": app},
    })
}

/// What the model expects of one container whose values are all known numbers.
enum Expected {
    None,
    Request(Box<ContainerRequest>),
    /// The fields that must be named in the error.
    Violations(Vec<String>),
}

fn model(c: &GenContainer, config: &RequestConfig) -> Option<Expected> {
    let names = &config.resources;
    let mut bad = Vec::new();
    let mut value =
        |q: &Option<(Q, bool)>, name: &str, min: u64, max: u64| -> Option<Option<u64>> {
            match q {
                None => Some(None),
                Some((Q::Whole(n, _), _)) => {
                    if !(min..=max).contains(n) {
                        bad.push(name.to_owned());
                    }
                    Some(Some(*n))
                }
                Some((Q::Text(_), _)) => None,
            }
        };
    let count = value(&c.count, &names.count, 0, u64::from(MAX_GPUS_PER_CONTAINER))?;
    let memory = value(&c.memory, &names.memory, 1, MAX_MEMORY_MIB)?;
    let percentage = value(&c.percentage, &names.memory_percentage, 1, 100)?;
    let cores = value(&c.cores, &names.cores, 0, 100)?;
    let priority = value(&c.priority, &names.priority, 0, 1)?;
    let slice = memory.is_some() || percentage.is_some() || cores.is_some();
    if !slice && matches!(count, None | Some(0)) {
        return Some(if bad.is_empty() {
            Expected::None
        } else {
            Expected::Violations(bad)
        });
    }
    if memory.is_some() && percentage.is_some() {
        bad.push(names.memory.clone());
    }
    if count == Some(0) {
        bad.push(names.count.clone());
    }
    if !bad.is_empty() {
        return Some(Expected::Violations(bad));
    }
    let memory = match (memory, percentage) {
        (Some(m), _) => MemoryRequest::Mib(m),
        (_, Some(p)) => MemoryRequest::Percent(p as u32),
        _ if config.default_memory == 0 => MemoryRequest::Percent(100),
        _ => MemoryRequest::Mib(config.default_memory),
    };
    let cores = match cores {
        Some(c) => c as u32,
        None if memory.is_whole_device() => 100,
        None => config.default_cores,
    };
    Some(Expected::Request(Box::new(ContainerRequest {
        name: c.name.clone(),
        kind: c.kind,
        count: count.map_or(config.default_gpu_num, |n| n as u32),
        memory,
        cores,
        priority: priority.map(|p| p as u32),
        family: Default::default(),
        vendor: None,
    })))
}

/// The annotation keys whose values the parser must refuse.
fn bad_annotations(a: &BTreeMap<String, String>) -> Vec<&'static str> {
    let mut bad = Vec::new();
    let get = |k: &str| a.get(k).map(String::as_str);
    if let Some(v) = get(keys::NUMA_BIND)
        && !["true", "false"].contains(&v.to_ascii_lowercase().as_str())
    {
        bad.push(keys::NUMA_BIND);
    }
    if let Some(v) = get(keys::VGPU_MODE)
        && !["hami-core", "mig", "mps"].contains(&v)
    {
        bad.push(keys::VGPU_MODE);
    }
    for key in [keys::GPU_SCHEDULER_POLICY, keys::NODE_SCHEDULER_POLICY] {
        if let Some(v) = get(key)
            && !["binpack", "spread"].contains(&v.trim().to_ascii_lowercase().as_str())
        {
            bad.push(key);
        }
    }
    let list = |k: &str| -> Vec<String> {
        get(k)
            .into_iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    // A list over the bounds is refused and reads as empty.
    let over = |k: &str| {
        get(k).is_some_and(|v| {
            let entries = list(k);
            v.len() > MAX_LIST_BYTES
                || entries.len() > MAX_LIST_ENTRIES
                || entries.iter().any(|e| e.len() > MAX_LIST_ENTRY_BYTES)
        })
    };
    let mut lists = Vec::new();
    for key in [
        keys::USE_GPU_TYPE,
        keys::NOUSE_GPU_TYPE,
        keys::USE_GPU_UUID,
        keys::NOUSE_GPU_UUID,
    ] {
        if over(key) {
            bad.push(key);
            lists.push(Vec::new());
        } else {
            lists.push(list(key));
        }
    }
    let (uses, nouses) = (&lists[2], &lists[3]);
    if uses.iter().any(|u| nouses.contains(u)) && !bad.contains(&keys::USE_GPU_UUID) {
        bad.push(keys::USE_GPU_UUID);
    }
    bad
}

/// A list annotation of `entries` (each written with blanks around it,
/// blank entries between), and its key.
fn list_annotation() -> impl Strategy<Value = (&'static str, Vec<String>, String)> {
    let entry = prop_oneof![
        4 => "[A-Za-z0-9-]{1,20}",
        1 => "[A-Za-z0-9-]{120,140}",
    ];
    (
        proptest::sample::select(vec![
            keys::USE_GPU_TYPE,
            keys::NOUSE_GPU_TYPE,
            keys::USE_GPU_UUID,
            keys::NOUSE_GPU_UUID,
        ]),
        proptest::collection::vec((entry, " {0,2}", ",{1,2}"), 0..=MAX_LIST_ENTRIES + 8),
        0usize..9000,
    )
        .prop_map(|(key, parts, padding)| {
            let mut value = String::new();
            let mut entries = Vec::new();
            for (entry, blank, comma) in parts {
                value.push_str(&blank);
                value.push_str(&entry);
                value.push_str(&blank);
                value.push_str(&comma);
                entries.push(entry);
            }
            // Sometimes padded with blank entries past the total bound.
            if padding > 8000 {
                value.push_str(&",".repeat(padding));
            }
            (key, entries, value)
        })
}

/// Any list over the bounds is refused naming the annotation and the bound;
/// any within them is read whole (types lowercased, UUIDs as a set).
#[test]
fn fuzz_list_annotation_bounds() {
    fuzz(
        "fuzz_list_annotation_bounds",
        300,
        list_annotation(),
        |(key, entries, value)| {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "annotations": {key: value}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            }))
            .expect("a pod decodes");
            let over = value.len() > MAX_LIST_BYTES
                || entries.len() > MAX_LIST_ENTRIES
                || entries.iter().any(|e| e.len() > MAX_LIST_ENTRY_BYTES);
            match parse_pod(&pod, &RequestConfig::default()) {
                Err(error) => {
                    let message = error.to_string();
                    prop_assert!(over, "refused a list within the bounds: {message}");
                    prop_assert!(
                        message.contains(&format!("annotation {key}: ")),
                        "{message}"
                    );
                    prop_assert!(
                        message.contains("at most") && message.len() < 300,
                        "{message}"
                    );
                }
                Ok(request) => {
                    prop_assert!(
                        !over,
                        "accepted {} entries, {} bytes",
                        entries.len(),
                        value.len()
                    );
                    let o = request.expect("a GPU request").options;
                    match key {
                        keys::USE_GPU_TYPE | keys::NOUSE_GPU_TYPE => {
                            let got = if key == keys::USE_GPU_TYPE {
                                o.use_gpu_types
                            } else {
                                o.nouse_gpu_types
                            };
                            let want: Vec<String> =
                                entries.iter().map(|e| e.to_lowercase()).collect();
                            prop_assert_eq!(got, want);
                        }
                        _ => {
                            let got = if key == keys::USE_GPU_UUID {
                                o.use_gpu_uuids
                            } else {
                                o.nouse_gpu_uuids
                            };
                            prop_assert_eq!(got, entries.into_iter().collect::<BTreeSet<_>>());
                        }
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_pod_request_structured() {
    fuzz("fuzz_pod_request_structured", 1000, gen_pod(), |pod| {
        let value = pod_json(&pod);
        let input = value.to_string().len();
        let parsed: Pod = serde_json::from_value(value).expect("a generated pod decodes");
        let result = parse_pod(&parsed, &pod.config);
        bounded("parse_pod", format!("{result:?}").len(), input)?;
        let config = &pod.config;
        let names = &config.resources;

        // Containers come out in kubelet start order: init containers first.
        let order: Vec<&GenContainer> = pod
            .containers
            .iter()
            .filter(|c| c.kind != ContainerKind::App)
            .chain(
                pod.containers
                    .iter()
                    .filter(|c| c.kind == ContainerKind::App),
            )
            .collect();
        let mut expected = Vec::new();
        let mut must_name: Vec<(Option<String>, String)> = Vec::new();
        let mut all_known = true;
        for c in &order {
            match model(c, config) {
                None => all_known = false,
                Some(Expected::None) => {}
                Some(Expected::Request(r)) => expected.push(*r),
                Some(Expected::Violations(fields)) => {
                    must_name.extend(fields.into_iter().map(|f| (Some(c.name.clone()), f)))
                }
            }
        }
        let read_annotations = !expected.is_empty() || !must_name.is_empty() || !all_known;
        let bad_keys = bad_annotations(&pod.annotations);

        match &result {
            Err(error) => {
                let tessera_api::Error::InvalidPodRequest(violations) = error else {
                    return Err(TestCaseError::fail(format!(
                        "unexpected error kind: {error}"
                    )));
                };
                prop_assert!(!violations.0.is_empty());
                let message = error.to_string();
                for v in &violations.0 {
                    // Every violation names a field the pod could have set,
                    // and the container it belongs to.
                    let known: Vec<&str> = vec![
                        &names.count,
                        &names.memory,
                        &names.memory_percentage,
                        &names.cores,
                        &names.priority,
                    ];
                    match &v.container {
                        Some(name) => {
                            prop_assert!(known.contains(&v.field.as_str()), "{v}");
                            prop_assert!(pod.containers.iter().any(|c| &c.name == name), "{v}");
                        }
                        None => prop_assert!(bad_keys.contains(&v.field.as_str()), "{v}"),
                    }
                    prop_assert!(message.contains(&v.field), "{message}");
                }
                for (container, field) in &must_name {
                    prop_assert!(
                        violations
                            .0
                            .iter()
                            .any(|v| &v.container == container && &v.field == field),
                        "{container:?} {field} not named in {message}"
                    );
                }
                if all_known && must_name.is_empty() {
                    prop_assert!(
                        read_annotations && !bad_keys.is_empty(),
                        "refused a valid pod: {message}"
                    );
                }
                if read_annotations {
                    for key in &bad_keys {
                        prop_assert!(
                            message.contains(&format!("annotation {key}")),
                            "{key}: {message}"
                        );
                    }
                }
            }
            Ok(None) => {
                prop_assert!(
                    expected.is_empty() && must_name.is_empty(),
                    "{expected:?} {must_name:?}"
                );
            }
            Ok(Some(request)) => {
                prop_assert!(
                    must_name.is_empty(),
                    "accepted, but {must_name:?} are invalid"
                );
                prop_assert!(
                    bad_keys.is_empty(),
                    "accepted, but {bad_keys:?} are invalid"
                );
                if all_known {
                    // Round trip: what was generated is what was parsed.
                    prop_assert_eq!(&request.containers, &expected);
                }
                // Whatever text was written, nothing out of range gets through.
                for r in &request.containers {
                    prop_assert!((1..=MAX_GPUS_PER_CONTAINER).contains(&r.count), "{r:?}");
                    prop_assert!(r.cores <= 100 && r.priority.is_none_or(|p| p <= 1), "{r:?}");
                    match r.memory {
                        MemoryRequest::Mib(m) => {
                            prop_assert!((1..=MAX_MEMORY_MIB).contains(&m), "{r:?}")
                        }
                        MemoryRequest::Percent(p) => prop_assert!((1..=100).contains(&p), "{r:?}"),
                    }
                }
                let o = &request.options;
                if let Some(mode) = pod.annotations.get(keys::VGPU_MODE) {
                    prop_assert_eq!(o.vgpu_mode.map(OperatingMode::as_str), Some(mode.as_str()));
                }
                if let Some(policy) = pod.annotations.get(keys::GPU_SCHEDULER_POLICY) {
                    prop_assert_eq!(
                        o.gpu_policy.map(SchedulingPolicy::as_str),
                        Some(&*policy.trim().to_ascii_lowercase())
                    );
                }
                for id in o.use_gpu_uuids.iter().chain(&o.nouse_gpu_types) {
                    prop_assert!(!id.is_empty() && !id.contains(',') && id.trim() == id);
                }
            }
        }
        Ok(())
    });
}

/// An arbitrary JSON value, nested within bounds, with hostile leaves.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        Just(Value::from("-1")),
        Just(Value::from("1e308")),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    "[a-zA-Z/.-]{1,12}",
                    "\\PC{0,6}",
                    Just("nvidia.com/gpu".to_owned())
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every JSON pointer in a value, so a generated subtree can be swapped in anywhere.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let next = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(next.clone());
                pointers(v, next, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let next = format!("{at}/{i}");
                out.push(next.clone());
                pointers(v, next, out);
            }
        }
        _ => {}
    }
}

/// A generated pod with one subtree replaced by an arbitrary JSON value.
fn mutated(value: &Value, pick: usize, replacement: Value) -> Value {
    let mut value = value.clone();
    let mut all = Vec::new();
    pointers(&value, String::new(), &mut all);
    if let Some(pointer) = all.get(pick % all.len().max(1))
        && let Some(slot) = value.pointer_mut(pointer)
    {
        *slot = replacement;
    }
    value
}

#[test]
fn fuzz_pod_request_hostile_json() {
    let strategy = prop_oneof![
        2 => (gen_pod(), any::<usize>(), json_value()).prop_map(|(pod, pick, v)| mutated(&pod_json(&pod), pick, v).to_string().into_bytes()),
        1 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
        1 => (1usize..20_000, any::<bool>()).prop_map(|(depth, arrays)| {
            let (open, close) = if arrays { ("[", "]") } else { ("{\"a\":", "}") };
            format!("{{\"spec\":{}1{}}}", open.repeat(depth), close.repeat(depth)).into_bytes()
        }),
    ];
    fuzz("fuzz_pod_request_hostile_json", 500, strategy, |bytes| {
        // The webhook and the extender decode pods with serde_json; deep
        // nesting must be an error (recursion limit), not a stack overflow.
        if let Ok(pod) = serde_json::from_slice::<Pod>(&bytes) {
            let result = parse_pod(&pod, &RequestConfig::default());
            bounded("parse_pod", format!("{result:?}").len(), bytes.len())?;
            if let Err(error) = result {
                let tessera_api::Error::InvalidPodRequest(violations) = &error else {
                    return Err(TestCaseError::fail(format!(
                        "unexpected error kind: {error}"
                    )));
                };
                for v in &violations.0 {
                    prop_assert!(!v.field.is_empty() && error.to_string().contains(&v.field));
                }
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// GpuNodeConfig specs.

fn glob() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c*?]{0,6}",
        "[a-z0-9.*?-]{0,20}",
        // Backtracking stress: a*a*a*…b against aaaa….
        (1usize..40).prop_map(|n| format!("{}b", "a*".repeat(n))),
        "\\PC{0,8}",
    ]
}

fn spec_json() -> impl Strategy<Value = Value> {
    let expression = (
        "[a-c]{1,2}",
        prop_oneof![
            Just("In"),
            Just("NotIn"),
            Just("Exists"),
            Just("DoesNotExist"),
            Just("Like"),
            Just("")
        ],
        proptest::collection::vec("[a-c]{0,2}", 0..3),
    )
        .prop_map(|(key, op, values)| json!({"key": key, "operator": op, "values": values}));
    let selector = (
        proptest::collection::btree_map("[a-c]{1,2}", "[a-c]{0,2}", 0..3),
        proptest::collection::vec(expression, 0..3),
    )
        .prop_map(|(labels, exprs)| json!({"matchLabels": labels, "matchExpressions": exprs}));
    let scaling = prop_oneof![
        Just(1.0),
        Just(0.5),
        Just(0.0),
        Just(-1.0),
        Just(100.0),
        Just(1e308),
        Just(5e-324),
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
    ];
    (
        proptest::option::of(selector),
        proptest::collection::vec(glob(), 0..4),
        any::<i32>(),
        proptest::option::of(prop_oneof![1u32..=100, any::<u32>()]),
        (
            proptest::option::of(scaling.clone()),
            proptest::option::of(scaling),
        ),
        proptest::option::of(proptest::sample::select(&["hami-core", "mig", "mps"][..])),
        proptest::option::of(proptest::sample::select(&["none", "mixed"][..])),
        proptest::option::of(any::<u8>()),
        proptest::option::of(proptest::sample::select(
            &["default", "force", "disable"][..],
        )),
        proptest::option::of((
            proptest::collection::vec("GPU-[a-c]", 0..3),
            proptest::collection::vec(0u32..4, 0..3),
        )),
    )
        .prop_map(
            |(selector, names, priority, split, (mem, core), mode, mig, log, policy, filter)| {
                let mut spec = json!({"nodeNames": names, "priority": priority});
                let set = |spec: &mut Value, key: &str, v: Option<Value>| {
                    if let Some(v) = v {
                        spec[key] = v;
                    }
                };
                set(&mut spec, "nodeSelector", selector);
                set(&mut spec, "deviceSplitCount", split.map(Value::from));
                set(&mut spec, "deviceMemoryScaling", mem.map(Value::from));
                set(&mut spec, "deviceCoreScaling", core.map(Value::from));
                set(&mut spec, "operatingMode", mode.map(Value::from));
                set(&mut spec, "migStrategy", mig.map(Value::from));
                set(&mut spec, "libCudaLogLevel", log.map(Value::from));
                set(&mut spec, "gpuCorePolicy", policy.map(Value::from));
                set(
                    &mut spec,
                    "filterDevices",
                    filter.map(|(u, i)| json!({"uuids": u, "indexes": i})),
                );
                spec
            },
        )
}

/// A reference glob matcher (dynamic programming over both strings).
fn glob_reference(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let mut row = vec![false; n.len() + 1];
    row[0] = true;
    for &pc in &p {
        let mut next = vec![false; n.len() + 1];
        if pc == '*' {
            next[0] = row[0];
        }
        for j in 1..=n.len() {
            next[j] = match pc {
                '*' => row[j] || next[j - 1],
                '?' => row[j - 1],
                c => row[j - 1] && n[j - 1] == c,
            };
        }
        row = next;
    }
    row[n.len()]
}

#[test]
fn fuzz_gpu_node_config() {
    let strategy = (
        proptest::collection::vec(
            (
                spec_json(),
                proptest::option::of((any::<usize>(), json_value())),
            ),
            0..6,
        ),
        prop_oneof!["[a-c]{0,4}", "a{0,60}", "\\PC{0,8}"],
        proptest::collection::btree_map("[a-c]{1,2}", "[a-c]{0,2}", 0..3),
    );
    fuzz(
        "fuzz_gpu_node_config",
        500,
        strategy,
        |(specs, node, labels)| {
            let mut configs = Vec::new();
            let mut input = node.len();
            for (i, (spec, hostile)) in specs.into_iter().enumerate() {
                let mut object = json!({
                    "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
                    "metadata": {"name": format!("cfg-{i}")}, "spec": spec,
                });
                if let Some((pick, value)) = hostile {
                    object = mutated(&object, pick, value);
                }
                input += object.to_string().len();
                // What the API server stores decodes or is refused; never a panic.
                let Ok(config) = serde_json::from_value::<GpuNodeConfig>(object.clone()) else {
                    continue;
                };
                // Round trip: a stored config reads back as itself.
                let again: GpuNodeConfig =
                    serde_json::from_value(serde_json::to_value(&config).unwrap()).unwrap();
                prop_assert_eq!(&again.spec, &config.spec);
                configs.push(config);
            }
            for config in &configs {
                for pattern in &config.spec.node_names {
                    prop_assert_eq!(
                        glob_matches(pattern, &node),
                        glob_reference(pattern, &node),
                        "{:?} vs {:?}",
                        pattern,
                        node
                    );
                }
            }
            let defaults = NodeSettings::default();
            let resolved = resolve(&node, &labels, &defaults, &configs);
            bounded("resolve", format!("{resolved:?}").len(), input)?;
            let selecting: Vec<&GpuNodeConfig> = configs
                .iter()
                .filter(|c| c.selects(&node, &labels))
                .collect();
            prop_assert_eq!(resolved.applied.len(), selecting.len());
            prop_assert!(resolved.conflicts.len() <= 8);
            for conflict in &resolved.conflicts {
                prop_assert!(
                    conflict.configs.len() >= 2 && conflict.configs.len() <= selecting.len()
                );
            }
            // The winner for a key: highest priority, then the name that sorts first.
            let winner = selecting
                .iter()
                .filter(|c| c.spec.device_split_count.is_some())
                .min_by(|a, b| {
                    b.spec
                        .priority
                        .cmp(&a.spec.priority)
                        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
                });
            prop_assert_eq!(
                resolved.settings.device_split_count,
                winner.map_or(defaults.device_split_count, |c| c
                    .spec
                    .device_split_count
                    .unwrap())
            );
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------
// The interposer's environment values (tessera_api::env).

/// The reference for `parse_memory_limit`: digits with an optional k/m/g.
fn memory_reference(value: &str) -> Option<u64> {
    let (digits, shift) = match value.chars().last()? {
        'k' | 'K' => (&value[..value.len() - 1], 10),
        'm' | 'M' => (&value[..value.len() - 1], 20),
        'g' | 'G' => (&value[..value.len() - 1], 30),
        _ => (value, 0),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let number: u128 = digits.trim_start_matches('0').parse().unwrap_or(
        if digits.trim_start_matches('0').is_empty() {
            0
        } else {
            u128::MAX
        },
    );
    let bytes = number.checked_mul(1 << shift)?;
    u64::try_from(bytes).ok().filter(|&b| b > 0)
}

#[test]
fn fuzz_env_values() {
    let value = prop_oneof![
        "[0-9]{0,22}[kKmMgGtb]?",
        "[-+ ]?[0-9]{1,4}(\\.[0-9])?[mg]?",
        (any::<u64>(), 0u8..4)
            .prop_map(|(n, unit)| format!("{n}{}", ["", "k", "m", "g"][usize::from(unit)])),
        "\\PC{0,8}",
        any::<String>(),
    ];
    let name = prop_oneof![
        Just(env::CUDA_DEVICE_MEMORY_LIMIT.to_owned()),
        (0usize..env::MAX_DEVICES).prop_map(env::memory_limit_var),
        "[A-Z_]{1,30}",
    ];
    fuzz("fuzz_env_values", 2000, (name, value), |(name, value)| {
        match (
            env::parse_memory_limit(&name, &value),
            memory_reference(&value),
        ) {
            (Ok(bytes), Some(want)) => prop_assert_eq!(bytes, want),
            (Err(error), None) => {
                let message = error.to_string();
                prop_assert!(message.starts_with(&format!("{name}=")), "{message}");
                bounded("error", message.len(), name.len() + value.len())?;
            }
            (got, want) => {
                return Err(TestCaseError::fail(format!(
                    "{value:?}: got {got:?}, reference {want:?}"
                )));
            }
        }
        let small = |v: &str, max: u8| -> Option<u8> {
            (!v.is_empty() && v.len() <= 3 && v.bytes().all(|b| b.is_ascii_digit()))
                .then(|| v.parse::<u8>().ok())
                .flatten()
                .filter(|&n| n <= max)
        };
        match env::parse_sm_limit(&value) {
            Ok(limit) => prop_assert_eq!(limit, small(&value, 100).filter(|&p| p != 0 && p != 100)),
            Err(error) => {
                prop_assert!(small(&value, 100).is_none());
                prop_assert!(error.to_string().starts_with(env::CUDA_DEVICE_SM_LIMIT));
            }
        }
        match env::parse_log_level(&value) {
            Ok(level) => prop_assert_eq!(Some(level), small(&value, 4)),
            Err(error) => prop_assert!(error.to_string().starts_with(env::LIBCUDA_LOG_LEVEL)),
        }
        match env::parse_switch(&name, &value) {
            Ok(on) => prop_assert_eq!(
                on,
                ["true", "1"].contains(&value.to_ascii_lowercase().as_str())
            ),
            Err(error) => {
                prop_assert!(
                    !["true", "1", "false", "0"].contains(&value.to_ascii_lowercase().as_str())
                );
                let prefix = format!("{name}=");
                prop_assert!(error.to_string().starts_with(&prefix));
            }
        }
        match env::CoreUtilizationPolicy::parse(&value) {
            Ok(policy) => prop_assert_eq!(policy.as_str(), value.to_ascii_lowercase()),
            Err(error) => prop_assert!(
                error
                    .to_string()
                    .starts_with(env::GPU_CORE_UTILIZATION_POLICY)
            ),
        }
        Ok(())
    });
}

#[test]
fn fuzz_env_memory_limit_round_trips() {
    fuzz(
        "fuzz_env_memory_limit_round_trips",
        1000,
        1u64..=(u64::MAX >> 20),
        |mib| {
            // What the node agent writes, the interposer reads back exactly.
            let written = env::format_memory_limit(mib);
            prop_assert_eq!(env::parse_memory_limit("V", &written).unwrap(), mib << 20);
            Ok(())
        },
    );
}

#[test]
fn fuzz_memory_request_resolve() {
    // A device's capacity comes from its GpuNode (what a node agent
    // published: physical MiB × deviceMemoryScaling), so any u64.
    let strategy = (
        prop_oneof![any::<u64>(), Just(u64::MAX), 0u64..1_000_000],
        1u32..=100,
    );
    fuzz(
        "fuzz_memory_request_resolve",
        1000,
        strategy,
        |(capacity, percent)| {
            let mib = MemoryRequest::Percent(percent).resolve(capacity);
            prop_assert!(mib <= capacity);
            prop_assert_eq!(
                u128::from(mib),
                u128::from(capacity) * u128::from(percent) / 100
            );
            prop_assert_eq!(MemoryRequest::Mib(capacity).resolve(0), capacity);
            Ok(())
        },
    );
}

/// Fixed corpus: inputs the targets found, kept as plain cases.
#[test]
fn fuzz_corpus_percent_of_the_largest_capacity() {
    assert_eq!(MemoryRequest::Percent(100).resolve(u64::MAX), u64::MAX);
    assert_eq!(MemoryRequest::Percent(50).resolve(u64::MAX), u64::MAX / 2);
}
