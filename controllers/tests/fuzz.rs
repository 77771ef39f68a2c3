//! Fuzz/property targets for what the controller reads from outside: the
//! API server's AdmissionReview bodies and kube-scheduler's ExtenderArgs and
//! ExtenderBindingArgs, decided against a ledger of hostile GpuNodes and
//! allocations. No control plane. See docs/fuzzing.md.
//!
//! Every target runs `PROPTEST_CASES` cases (its own default otherwise) and
//! prints how many it ran; `make fuzz` raises the count.

#![allow(missing_docs)]

use std::{collections::BTreeSet, fmt::Debug, sync::Arc, time::Instant};

use axum::{
    Json,
    body::{Body, to_bytes},
    http::Request,
};
use proptest::{
    prelude::*,
    test_runner::{Config as RunnerConfig, TestCaseError, TestRunner},
};
use serde_json::{Value, json};
use tessera_api::v1alpha1::OperatingMode;
use tessera_controllers::{
    config::Config,
    engine::{self, GpuDevice},
    extender::{
        filter, prioritize,
        wire::{ExtenderArgs, ExtenderBindingArgs},
    },
    metrics::Metrics,
    projection::{AllocationKey, LiveAllocation, Projection, UuidSlice},
    webhook::Webhook,
};
use tessera_scheduling::request::parse_pod;
use tower::ServiceExt;

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
    let config = RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    };
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    if let Err(error) = runner.run(&strategy, test) {
        panic!("{name}: {error}");
    }
    eprintln!("{name}: {cases} cases in {:.2?}", started.elapsed());
}

fn bounded(what: &str, output: usize, input: usize) -> Result<(), TestCaseError> {
    prop_assert!(
        output <= 64 * input + 8192,
        "{what}: {output} bytes of output for {input} bytes of input"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Generators.

fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(&["0", "1", "2", "64", "65", "100", "101", "1000", "3000", "81920", "2000m", "1k", "1e3", "4Ki"][..]).prop_map(str::to_owned),
        2 => "[-+]?[0-9]{0,22}(\\.[0-9]{0,6})?([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]{1,4})?",
        1 => "\\PC{0,10}",
    ]
}

fn limits() -> impl Strategy<Value = Value> {
    let key = proptest::sample::select(
        &[
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
            "nvidia.com/priority",
            "cpu",
        ][..],
    );
    proptest::collection::btree_map(key, quantity(), 0..5).prop_map(|m| json!(m))
}

fn container() -> impl Strategy<Value = Value> {
    (
        prop_oneof![4 => "[a-z][a-z0-9-]{0,6}", 1 => "\\PC{0,6}"],
        limits(),
        limits(),
        proptest::option::weighted(0.1, proptest::sample::select(&["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DISABLE_CONTROL", "PATH", "NVIDIA_VISIBLE_DEVICES"][..])),
        proptest::option::weighted(0.05, any::<bool>()),
    )
        .prop_map(|(name, limits, requests, env, privileged)| {
            let mut c = json!({"name": name, "image": "x", "resources": {"limits": limits, "requests": requests}});
            if let Some(env) = env {
                c["env"] = json!([{"name": env, "value": "1"}]);
            }
            if let Some(privileged) = privileged {
                c["securityContext"] = json!({"privileged": privileged});
            }
            c
        })
}

fn pod() -> impl Strategy<Value = Value> {
    let annotation = (
        proptest::sample::select(
            &[
                "nvidia.com/use-gputype",
                "nvidia.com/nouse-gputype",
                "nvidia.com/use-gpuuuid",
                "nvidia.com/nouse-gpuuuid",
                "nvidia.com/numa-bind",
                "nvidia.com/vgpu-mode",
                "hami.io/gpu-scheduler-policy",
                "hami.io/node-scheduler-policy",
            ][..],
        ),
        prop_oneof![
            proptest::sample::select(
                &[
                    "true",
                    "false",
                    "mig",
                    "hami-core",
                    "binpack",
                    "spread",
                    "A100",
                    "GPU-n1-0",
                    "GPU-n1-0,GPU-n2-1"
                ][..]
            )
            .prop_map(str::to_owned),
            "\\PC{0,8}",
        ],
    );
    (
        proptest::collection::vec(container(), 0..4),
        proptest::collection::vec(container(), 0..2),
        proptest::collection::btree_map(annotation.0, annotation.1, 0..4),
        proptest::option::weighted(0.1, prop_oneof![Just("default-scheduler"), Just("tessera-scheduler"), Just("other")]),
        proptest::option::weighted(0.05, Just("n1")),
    )
        .prop_map(|(containers, init, annotations, scheduler, node)| {
            let mut spec = json!({"containers": containers, "initContainers": init});
            if let Some(s) = scheduler {
                spec["schedulerName"] = json!(s);
            }
            if let Some(n) = node {
                spec["nodeName"] = json!(n);
            }
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "annotations": annotations}, "spec": spec})
        })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,10}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            proptest::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

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

/// `value` with the subtree at one of its pointers replaced.
fn mutated(mut value: Value, pick: usize, replacement: Value) -> Value {
    let mut all = Vec::new();
    pointers(&value, String::new(), &mut all);
    if let Some(pointer) = all.get(pick % all.len().max(1))
        && let Some(slot) = value.pointer_mut(pointer)
    {
        *slot = replacement;
    }
    value
}

/// A ledger of nodes n0..n3 with hostile capacities (any u64 MiB, any u32
/// cores and split count, as a GpuNode may carry them) and allocations
/// holding any amounts (as a VgpuAllocation may).
/// A device's memory MiB, cores, split count, health and NUMA node.
type Device = (u64, u32, u32, bool, Option<u32>);

#[derive(Clone, Debug)]
struct Cluster {
    nodes: Vec<Vec<Device>>,
    allocations: Vec<(usize, usize, u64, u32)>,
    not_ready: Option<usize>,
}

fn cluster() -> impl Strategy<Value = Cluster> {
    let device = (
        prop_oneof![3 => Just(81_920u64), 1 => 0u64..100, 1 => any::<u64>(), 1 => Just(u64::MAX)],
        prop_oneof![3 => Just(100u32), 1 => any::<u32>()],
        prop_oneof![3 => 1u32..=10, 1 => any::<u32>()],
        prop_oneof![4 => Just(true), 1 => Just(false)],
        proptest::option::of(0u32..2),
    );
    (
        proptest::collection::vec(proptest::collection::vec(device, 0..4), 0..4),
        proptest::collection::vec(
            (
                0usize..4,
                0usize..4,
                prop_oneof![1u64..50_000, any::<u64>()],
                prop_oneof![0u32..=100, any::<u32>()],
            ),
            0..8,
        ),
        proptest::option::of(0usize..4),
    )
        .prop_map(|(nodes, allocations, not_ready)| Cluster {
            nodes,
            allocations,
            not_ready,
        })
}

fn projection(cluster: &Cluster) -> Projection {
    let (projection, feeder) = Projection::new();
    feeder.mark_all_synced();
    {
        let mut ledger = feeder.write();
        for (n, devices) in cluster.nodes.iter().enumerate() {
            let devices = devices
                .iter()
                .enumerate()
                .map(
                    |(g, &(memory_mib, cores, split_count, healthy, numa_node))| GpuDevice {
                        cordoned: false,
                        family: Default::default(),
                        network_id: None,
                        uuid: format!("GPU-n{n}-{g}"),
                        index: g as u32,
                        model: "NVIDIA A100-SXM4-80GB".into(),
                        memory_mib,
                        cores,
                        split_count,
                        numa_node,
                        healthy,
                        mode: OperatingMode::HamiCore,
                        mig: None,
                        mig_present: 0,
                        profiles: Vec::new(),
                        minor: None,
                        qos_policy: None,
                    },
                )
                .collect();
            ledger.set_node(&format!("n{n}"), devices);
        }
        for (i, &(node, gpu, memory_mib, cores)) in cluster.allocations.iter().enumerate() {
            ledger.insert_allocation(
                AllocationKey {
                    namespace: "other".into(),
                    name: format!("a{i}"),
                },
                LiveAllocation {
                    quota: Default::default(),
                    pod_uid: format!("uid-{i}"),
                    priority: None,
                    nominated: false,
                    node: format!("n{node}"),
                    slices: vec![UuidSlice {
                        mutex: false,
                        uuid: format!("GPU-n{node}-{gpu}"),
                        memory_mib,
                        cores,
                        mig: None,
                        core_indexes: Vec::new(),
                        units: 1,
                        sharing: None,
                    }],
                },
            );
        }
        if let Some(n) = cluster.not_ready {
            ledger.set_not_ready(&format!("n{n}"), Some("agent restarting".into()));
        }
    }
    // Keep the feeder alive: a dropped feeder is a projection that stopped.
    std::mem::forget(feeder);
    projection
}

// ---------------------------------------------------------------------------
// The webhook.

/// A field of an AdmissionReview given a value of the wrong type, and the
/// path the answer must name.
const WRONG_TYPES: &[(&str, &str)] = &[
    ("/request/uid", "request.uid"),
    ("/request/operation", "request.operation"),
    ("/request/kind", "request.kind"),
    ("/request/userInfo", "request.userInfo"),
    ("/request/object/spec", "request.object.spec"),
    (
        "/request/object/spec/containers",
        "request.object.spec.containers",
    ),
    (
        "/request/object/spec/containers/0/name",
        "request.object.spec.containers[0].name",
    ),
    (
        "/request/object/metadata/annotations",
        "request.object.metadata.annotations",
    ),
];

#[derive(Clone, Debug)]
enum ReviewBody {
    /// A well-formed review of a generated pod.
    Review(Value),
    /// A review with one field of the wrong type: the answer names its path.
    WrongType(Value, &'static str),
    /// Anything else.
    Bytes(Vec<u8>),
}

fn review(pod: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE", "namespace": "default", "name": "p",
            "userInfo": {"username": "admin"},
            "object": pod,
            "dryRun": false,
        },
    })
}

fn body() -> impl Strategy<Value = ReviewBody> {
    let wrong = prop_oneof![
        Just(json!(7)),
        Just(json!(true)),
        Just(json!([1])),
        Just(json!("DESTROY"))
    ];
    prop_oneof![
        4 => pod().prop_map(|p| ReviewBody::Review(review(p))),
        2 => (pod(), proptest::sample::select(WRONG_TYPES), wrong).prop_map(|(p, (pointer, path), value)| {
            let mut review = review(p);
            // A pod without containers has no containers[0]: use the uid.
            let (pointer, path) = if review.pointer(pointer).is_some() { (pointer, path) } else { WRONG_TYPES[0] };
            // A string is the right type for uid and name; 7 is wrong for every field.
            let value = if value.is_string() && (pointer.ends_with("uid") || pointer.ends_with("name")) { json!(7) } else { value };
            *review.pointer_mut(pointer).unwrap() = value;
            ReviewBody::WrongType(review, path)
        }),
        2 => (pod(), any::<usize>(), json_value()).prop_map(|(p, pick, v)| ReviewBody::Bytes(mutated(review(p), pick, v).to_string().into_bytes())),
        1 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(ReviewBody::Bytes),
        1 => (1usize..5000).prop_map(|depth| ReviewBody::Bytes(format!("{{\"request\":{}1{}}}", "[".repeat(depth), "]".repeat(depth)).into_bytes())),
    ]
}

#[test]
fn fuzz_admission_review() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let strategy = (body(), cluster(), any::<bool>());
    fuzz(
        "fuzz_admission_review",
        1000,
        strategy,
        |(body, cluster, allow_env)| {
            let projection = projection(&cluster);
            let metrics = Metrics::new(projection.clone(), Default::default());
            let config = Config {
                allow_enforcement_env: allow_env,
                ..Config::default()
            };
            let router = Webhook::new(
                Arc::new(config.clone()),
                projection.clone(),
                metrics.webhook.clone(),
            )
            .router();
            let bytes = match &body {
                ReviewBody::Review(v) | ReviewBody::WrongType(v, _) => v.to_string().into_bytes(),
                ReviewBody::Bytes(b) => b.clone(),
            };
            let input = bytes.len();
            // The production path: the router's POST /mutate handler.
            let (status, answer) = runtime.block_on(async {
                let response = router
                    .oneshot(
                        Request::post("/mutate")
                            .header("content-type", "application/json")
                            .body(Body::from(bytes))
                            .unwrap(),
                    )
                    .await
                    .unwrap();
                let status = response.status();
                (
                    status,
                    to_bytes(response.into_body(), usize::MAX).await.unwrap(),
                )
            });
            bounded("review answer", answer.len(), input)?;
            // Always an AdmissionReview, never a bare HTTP error.
            prop_assert_eq!(status.as_u16(), 200);
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            let response = &answer["response"];
            prop_assert!(response["allowed"].is_boolean(), "{answer}");
            let message = response["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            match body {
                ReviewBody::Review(review) => {
                    prop_assert_eq!(&response["uid"], &review["request"]["uid"]);
                    let pod = serde_json::from_value(review["request"]["object"].clone()).unwrap();
                    match parse_pod(&pod, &config.request) {
                        Ok(None) => prop_assert!(
                            response["allowed"] == true && response["patch"].is_null(),
                            "{answer}"
                        ),
                        Err(error) => {
                            prop_assert!(response["allowed"] == false, "{answer}");
                            prop_assert!(message.contains(&error.to_string()), "{message}");
                        }
                        Ok(Some(_)) => {
                            // Admitted with a patch setting the scheduler, or refused
                            // with a message naming the field or container at fault.
                            if response["allowed"] == true {
                                prop_assert!(!response["patch"].is_null(), "{answer}");
                            } else {
                                prop_assert!(
                                    [
                                        "spec.nodeName",
                                        "spec.schedulerName",
                                        "container ",
                                        "nvidia.com/gpumem"
                                    ]
                                    .iter()
                                    .any(|f| message.contains(f)),
                                    "{message}"
                                );
                            }
                        }
                    }
                }
                ReviewBody::WrongType(_, path) => {
                    prop_assert!(response["allowed"] == false, "{answer}");
                    prop_assert!(message.contains(path), "{path} not named: {message}");
                }
                ReviewBody::Bytes(_) => {}
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------
// The extender.

#[derive(Clone, Debug)]
enum Args {
    Valid(Value),
    WrongType(Value, &'static str),
    Bytes(Vec<u8>),
}

fn extender_args() -> impl Strategy<Value = Args> {
    let names = proptest::collection::vec(prop_oneof![4 => "n[0-5]", 1 => "\\PC{0,6}"], 0..6);
    let valid = (pod(), names, any::<bool>())
        .prop_map(|(pod, names, as_objects)| {
            if as_objects {
                let items: Vec<Value> = names
                    .iter()
                    .map(|n| json!({"metadata": {"name": n}, "status": {}}))
                    .collect();
                json!({"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": null})
            } else {
                json!({"Pod": pod, "Nodes": null, "NodeNames": names})
            }
        })
        .boxed();
    prop_oneof![
        4 => valid.clone().prop_map(Args::Valid),
        1 => (valid.clone(), proptest::sample::select(&[
                ("/Pod/spec/containers", "Pod.spec.containers"),
                ("/Pod/metadata", "Pod.metadata"),
                ("/NodeNames", "NodeNames"),
                ("/Nodes", "Nodes"),
            ][..]))
            .prop_map(|(mut v, (pointer, path))| {
                *v.pointer_mut(pointer).unwrap() = json!(7);
                Args::WrongType(v, path)
            }),
        2 => (valid, any::<usize>(), json_value()).prop_map(|(v, pick, r)| Args::Bytes(mutated(v, pick, r).to_string().into_bytes())),
        1 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(Args::Bytes),
    ]
}

#[test]
fn fuzz_extender_args() {
    fuzz(
        "fuzz_extender_args",
        1000,
        (extender_args(), cluster()),
        |(args, cluster)| {
            let projection = projection(&cluster);
            let config = Config::default();
            let bytes = match &args {
                Args::Valid(v) | Args::WrongType(v, _) => v.to_string().into_bytes(),
                Args::Bytes(b) => b.clone(),
            };
            // The decode the /filter and /prioritize handlers run (axum's Json extractor).
            let decoded = Json::<ExtenderArgs>::from_bytes(&bytes);
            let args_value = match (&args, decoded) {
                (Args::WrongType(_, path), Err(rejection)) => {
                    let message = rejection.body_text();
                    prop_assert!(message.contains(path), "{path} not named: {message}");
                    return Ok(());
                }
                (Args::WrongType(..), Ok(_)) => {
                    return Err(TestCaseError::fail("a wrong type was accepted"));
                }
                (Args::Valid(_), Err(rejection)) => {
                    return Err(TestCaseError::fail(format!(
                        "refused: {}",
                        rejection.body_text()
                    )));
                }
                (_, Err(_)) => return Ok(()),
                (_, Ok(Json(args))) => args,
            };
            let args = args_value;
            let candidates: Vec<String> = args
                .candidate_names()
                .into_iter()
                .map(str::to_owned)
                .collect();
            let result = filter(&projection, &config, &args);
            bounded(
                "filter",
                serde_json::to_string(&result).unwrap().len(),
                bytes.len(),
            )?;
            let request = parse_pod(&args.pod, &config.request);
            if let Err(error) = &request {
                prop_assert_eq!(&result.error, &error.to_string());
            } else {
                prop_assert!(result.error.is_empty(), "{}", result.error);
                // Every candidate is answered: feasible, or failed with a reason.
                let feasible: Vec<String> = match (&result.node_names, &result.nodes) {
                    (Some(names), None) => names.clone(),
                    (None, Some(nodes)) => nodes
                        .items
                        .iter()
                        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
                        .collect(),
                    other => {
                        return Err(TestCaseError::fail(format!(
                            "answered in neither form: {other:?}"
                        )));
                    }
                };
                let answered: BTreeSet<&String> = feasible
                    .iter()
                    .chain(result.failed_nodes.keys())
                    .chain(result.failed_and_unresolvable_nodes.keys())
                    .collect();
                for c in &candidates {
                    prop_assert!(answered.contains(c), "{c} not answered");
                }
                for reason in result
                    .failed_nodes
                    .values()
                    .chain(result.failed_and_unresolvable_nodes.values())
                {
                    prop_assert!(!reason.is_empty());
                }
                // A node Filter calls feasible is one Bind's fit can place the pod on.
                if let Ok(Some(request)) = &request {
                    let mut request = request.clone();
                    let policy = config.gpu_policy_of(&mut request.options);
                    let ledger = projection.read();
                    for name in &feasible {
                        let node = ledger.node(name).unwrap();
                        let placement = engine::fit(node, &request, policy);
                        prop_assert!(placement.is_ok(), "{name} feasible but {:?}", placement);
                        let mut after = node.clone();
                        for slice in placement.unwrap().slices() {
                            after.charge(slice);
                        }
                        if node.within_capacity() {
                            prop_assert!(
                                after.within_capacity(),
                                "{name}: placing the pod overfills it"
                            );
                        }
                    }
                }
            }
            let scores = prioritize(&projection, &config, &args, |_| false);
            prop_assert_eq!(scores.len(), candidates.len());
            for s in &scores {
                prop_assert!((0..=10).contains(&s.score), "{s:?}");
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_extender_binding_args() {
    let valid = ("\\PC{0,10}", "\\PC{0,10}", "\\PC{0,10}", "\\PC{0,10}").prop_map(
        |(n, ns, uid, node)| json!({"PodName": n, "PodNamespace": ns, "PodUID": uid, "Node": node}),
    );
    let strategy = prop_oneof![
        2 => valid.clone().prop_map(Args::Valid),
        1 => (valid.clone(), proptest::sample::select(&[("/PodName", "PodName"), ("/PodUID", "PodUID"), ("/Node", "Node")][..]), json_value())
            .prop_map(|(mut v, (pointer, path), r)| {
                *v.pointer_mut(pointer).unwrap() = if r.is_string() { json!(7) } else { r };
                Args::WrongType(v, path)
            }),
        1 => (valid, any::<usize>(), json_value()).prop_map(|(v, pick, r)| Args::Bytes(mutated(v, pick, r).to_string().into_bytes())),
        1 => proptest::collection::vec(any::<u8>(), 0..128).prop_map(Args::Bytes),
    ];
    fuzz("fuzz_extender_binding_args", 1000, strategy, |args| {
        let bytes = match &args {
            Args::Valid(v) | Args::WrongType(v, _) => v.to_string().into_bytes(),
            Args::Bytes(b) => b.clone(),
        };
        // The decode the /bind handler runs before Binder::bind.
        match (&args, Json::<ExtenderBindingArgs>::from_bytes(&bytes)) {
            (Args::Valid(v), Ok(Json(decoded))) => {
                // Round trip: what kube-scheduler sent is what Bind sees.
                prop_assert_eq!(&serde_json::to_value(&decoded).unwrap(), v);
            }
            (Args::Valid(_), Err(rejection)) => {
                return Err(TestCaseError::fail(format!(
                    "refused: {}",
                    rejection.body_text()
                )));
            }
            (Args::WrongType(_, path), Err(rejection)) => {
                let message = rejection.body_text();
                prop_assert!(message.contains(path), "{path} not named: {message}");
                bounded("rejection", message.len(), bytes.len())?;
            }
            (Args::WrongType(..), Ok(_)) => {
                return Err(TestCaseError::fail("a wrong type was accepted"));
            }
            (Args::Bytes(_), Err(rejection)) => {
                bounded("rejection", rejection.body_text().len(), bytes.len())?
            }
            (Args::Bytes(_), Ok(_)) => {}
        }
        Ok(())
    });
}
