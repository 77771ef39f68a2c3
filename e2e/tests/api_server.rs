//! Tessera's CRDs against a real kube-apiserver: installation, `kubectl get`
//! columns, and the validation the API server enforces.

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tessera_api::v1alpha1::{
    AllocationPhase, GpuNode, GpuNodeConfig, NodeLock, VgpuAllocation, VgpuAllocationStatus,
};
use tessera_e2e::ControlPlane;

async fn cluster() -> (&'static ControlPlane, Client) {
    let cluster = tessera_e2e::shared().await.expect("control plane starts");
    let client = cluster.client().await.expect("admin client");
    (cluster, client)
}

fn dynamic<K: kube::Resource<DynamicType = ()>>(
    client: &Client,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<K>(&());
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

fn object<K: kube::Resource<DynamicType = ()>>(body: Value) -> DynamicObject {
    let mut value = body;
    value["apiVersion"] = json!(K::api_version(&()));
    value["kind"] = json!(K::kind(&()));
    serde_json::from_value(value).expect("a valid object shape")
}

/// The API server's message when it refuses `body`.
async fn refused(api: &Api<DynamicObject>, body: DynamicObject) -> String {
    match api.create(&PostParams::default(), &body).await {
        Ok(created) => panic!("the API server accepted an invalid object: {created:?}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            status.message
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

async fn ensure_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

fn kubectl(cluster: &ControlPlane, args: &[&str]) -> String {
    let output = cluster
        .kubectl()
        .unwrap()
        .args(args)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn allocation(name: &str, node: &str, uuid_memory_cores: &[(&str, u64, u32)]) -> Value {
    let devices: Vec<Value> = uuid_memory_cores
        .iter()
        .enumerate()
        .map(|(i, (uuid, mib, cores))| json!({"uuid": uuid, "index": i, "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": mib, "cores": cores}))
        .collect();
    let memory: u64 = uuid_memory_cores.iter().map(|d| d.1).sum();
    let cores: u32 = uuid_memory_cores.iter().map(|d| d.2).sum();
    let uuids: Vec<&str> = uuid_memory_cores.iter().map(|d| d.0).collect();
    json!({
        "metadata": {"name": name},
        "spec": {
            "podName": name, "podUid": format!("uid-{name}"), "nodeName": node,
            "containers": [{"name": "main", "devices": devices}],
            "gpuPolicy": "spread", "nodePolicy": "binpack",
            "totals": {"devices": uuids.join(","), "families": "nvidia", "memoryMiB": memory, "cores": cores},
        },
    })
}

#[tokio::test]
async fn crds_install_and_become_established() {
    let (cluster, _) = cluster().await;
    let out = kubectl(
        cluster,
        &[
            "get",
            "crd",
            "-o",
            "custom-columns=NAME:.metadata.name,ESTABLISHED:.status.conditions[?(@.type==\"Established\")].status",
            "--no-headers",
        ],
    );
    for name in ["gpunodes", "vgpuallocations", "nodelocks", "gpunodeconfigs"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name}.tessera.dev")))
            .unwrap_or_else(|| panic!("{name} missing in:\n{out}"));
        assert!(line.ends_with("True"), "{line}");
    }
    // The short names and the category resolve.
    kubectl(cluster, &["get", "vgpu,gpun,nlock,gpucfg", "-A"]);
    kubectl(cluster, &["get", "tessera", "-A"]);
}

#[tokio::test]
async fn kubectl_get_prints_the_printer_columns() {
    let (cluster, client) = cluster().await;
    ensure_namespace(&client, "columns").await;

    let allocations = dynamic::<VgpuAllocation>(&client, Some("columns"));
    let body = allocation(
        "train",
        "node-a",
        &[("GPU-aaaa", 3000, 30), ("GPU-bbbb", 3000, 30)],
    );
    allocations
        .create(&PostParams::default(), &object::<VgpuAllocation>(body))
        .await
        .unwrap();
    let typed: Api<VgpuAllocation> = Api::namespaced(client.clone(), "columns");
    let status = VgpuAllocationStatus {
        phase: Some(AllocationPhase::Allocated),
        ..Default::default()
    };
    typed
        .patch_status(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();

    let out = kubectl(cluster, &["get", "vgpuallocations", "-A"]);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "POD",
            "NODE",
            "DEVICES",
            "FAMILY",
            "MEMORY",
            "CORES",
            "CLAIM",
            "HELD-UNTIL",
            "PHASE",
            "AGE"
        ]
    );
    let row = lines
        .find(|l| l.starts_with("columns"))
        .expect("our allocation is listed");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..9],
        [
            "columns",
            "train",
            "train",
            "node-a",
            "GPU-aaaa,GPU-bbbb",
            "nvidia",
            "6000",
            "60",
            // CLAIM and HELD-UNTIL are blank: a pod's allocation mirrors
            // no claim and holds nothing for a preemptor.
            "Allocated"
        ]
    );

    let nodes = dynamic::<GpuNode>(&client, None);
    nodes
        .create(
            &PostParams::default(),
            &object::<GpuNode>(json!({"metadata": {"name": "node-a"}, "spec": {}})),
        )
        .await
        .unwrap();
    let gpunode_status = json!({"status": {
        "gpuCount": 2, "models": "NVIDIA A100-SXM4-80GB",
        "capacity": {"memoryMiB": 163840, "cores": 200, "slices": 20},
        "frontDoor": "devicePlugin",
        "settings": {"deviceSplitCount": 10, "deviceMemoryScaling": 1.0, "deviceCoreScaling": 1.0, "operatingMode": "hami-core", "migStrategy": "none", "libCudaLogLevel": 2, "gpuCorePolicy": "default"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Serving", "message": "device plugin registered", "lastTransitionTime": "2026-11-22T00:00:00Z"}],
    }});
    nodes
        .patch_status(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(gpunode_status),
        )
        .await
        .unwrap();
    let out = kubectl(cluster, &["get", "gpunodes"]);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "GPUS", "MODEL", "MEMORY", "DOOR", "READY", "AGE"]
    );
    let row = lines.find(|l| l.starts_with("node-a")).unwrap();
    assert!(
        row.contains("2   ")
            && row.contains("NVIDIA A100-SXM4-80GB")
            && row.contains("163840")
            && row.contains("devicePlugin")
            && row.contains("True"),
        "{row}"
    );
    let wide = kubectl(cluster, &["get", "gpunodes", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().contains("SLICES"), "{wide}");

    let locks = dynamic::<NodeLock>(&client, None);
    locks
        .create(
            &PostParams::default(),
            &object::<NodeLock>(lock_body(
                "node-a",
                60,
                "2026-11-22T10:00:00Z",
                "2026-11-22T10:01:00Z",
            )),
        )
        .await
        .unwrap();
    let out = kubectl(cluster, &["get", "nodelocks"]);
    assert!(
        out.lines().next().unwrap().split_whitespace().eq([
            "NAME",
            "HOLDER",
            "HOLDER-NAMESPACE",
            "EXPIRES",
            "AGE"
        ]),
        "{out}"
    );
    assert!(
        out.contains("train") && out.contains("2026-11-22T10:01:00Z"),
        "{out}"
    );

    let configs = dynamic::<GpuNodeConfig>(&client, None);
    let config = json!({"metadata": {"name": "inference"}, "spec": {"nodeNames": ["inference-pool-*"], "deviceSplitCount": 4, "deviceMemoryScaling": 1.5, "operatingMode": "hami-core", "frontDoor": "dra"}});
    configs
        .create(&PostParams::default(), &object::<GpuNodeConfig>(config))
        .await
        .unwrap();
    let out = kubectl(cluster, &["get", "gpunodeconfigs"]);
    assert!(
        out.lines().next().unwrap().split_whitespace().eq([
            "NAME",
            "NODES",
            "SELECTOR",
            "SPLIT",
            "MEM-SCALE",
            "CORE-SCALE",
            "MODE",
            "DOOR",
            "MATCHED",
            "AGE"
        ]),
        "{out}"
    );
    assert!(
        out.contains("inference-pool-*")
            && out.contains("1.5")
            && out.contains("hami-core")
            && out.contains(" dra "),
        "{out}"
    );
}

fn lock_body(node: &str, ttl: u32, acquired: &str, expires: &str) -> Value {
    json!({
        "metadata": {"name": node},
        "spec": {
            "holder": {"namespace": "columns", "name": "train", "uid": "uid-train"},
            "allocation": "train",
            "acquiredAt": acquired, "ttlSeconds": ttl, "expiresAt": expires,
        },
    })
}

#[tokio::test]
async fn invalid_gpu_node_configs_are_refused_with_the_field_and_rule() {
    let (_, client) = cluster().await;
    let configs = dynamic::<GpuNodeConfig>(&client, None);
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "zero-memory-scaling",
            json!({"nodeNames": ["a"], "deviceMemoryScaling": 0}),
            vec!["spec.deviceMemoryScaling", "greater than 0"],
        ),
        (
            "negative-core-scaling",
            json!({"nodeNames": ["a"], "deviceCoreScaling": -1}),
            vec!["spec.deviceCoreScaling", "greater than 0"],
        ),
        (
            "turbo-mode",
            json!({"nodeNames": ["a"], "operatingMode": "turbo"}),
            vec![
                "spec.operatingMode",
                "Unsupported value: \"turbo\"",
                "\"hami-core\", \"mig\", \"mps\"",
            ],
        ),
        (
            "bad-front-door",
            json!({"nodeNames": ["a"], "frontDoor": "both"}),
            vec![
                "spec.frontDoor",
                "Unsupported value: \"both\"",
                "\"devicePlugin\", \"dra\"",
            ],
        ),
        (
            "bad-mig-strategy",
            json!({"nodeNames": ["a"], "migStrategy": "dynamic"}),
            vec!["spec.migStrategy", "\"none\", \"single\", \"mixed\""],
        ),
        (
            "bad-mig-profile",
            json!({"nodeNames": ["a"], "migProfiles": ["3g.40gb", "big"]}),
            vec!["spec.migProfiles[1]", "should match", "gb"],
        ),
        (
            "split-zero",
            json!({"nodeNames": ["a"], "deviceSplitCount": 0}),
            vec!["spec.deviceSplitCount", "greater than or equal to 1"],
        ),
        (
            "split-huge",
            json!({"nodeNames": ["a"], "deviceSplitCount": 1000}),
            vec!["spec.deviceSplitCount", "less than or equal to 100"],
        ),
        (
            "log-level",
            json!({"nodeNames": ["a"], "libCudaLogLevel": 9}),
            vec!["spec.libCudaLogLevel", "less than or equal to 4"],
        ),
        (
            "core-policy",
            json!({"nodeNames": ["a"], "gpuCorePolicy": "always"}),
            vec!["spec.gpuCorePolicy", "\"default\", \"force\", \"disable\""],
        ),
        (
            "selects-nothing",
            json!({"deviceSplitCount": 4}),
            vec!["spec", "must select nodes"],
        ),
        (
            "bad-glob",
            json!({"nodeNames": ["Inference Pool"]}),
            vec!["spec.nodeNames", "glob"],
        ),
    ];
    for (name, spec, needles) in cases {
        let message = refused(
            &configs,
            object::<GpuNodeConfig>(json!({"metadata": {"name": name}, "spec": spec})),
        )
        .await;
        for needle in needles {
            assert!(
                message.contains(needle),
                "{name}: {message:?} lacks {needle:?}"
            );
        }
    }
    // Several broken rules in one object are all reported.
    let both = json!({"metadata": {"name": "both"}, "spec": {"nodeNames": ["a"], "deviceMemoryScaling": 0, "operatingMode": "turbo"}});
    let message = refused(&configs, object::<GpuNodeConfig>(both)).await;
    assert!(
        message.contains("spec.deviceMemoryScaling") && message.contains("spec.operatingMode"),
        "{message}"
    );
    // A selector alone is enough, and `{}` selects every node.
    let all = json!({"metadata": {"name": "every-node"}, "spec": {"nodeSelector": {}, "gpuCorePolicy": "force"}});
    configs
        .create(&PostParams::default(), &object::<GpuNodeConfig>(all))
        .await
        .unwrap();
}

#[tokio::test]
async fn vgpu_allocation_spec_is_immutable_and_consistent() {
    let (_, client) = cluster().await;
    ensure_namespace(&client, "immutable").await;
    let api = dynamic::<VgpuAllocation>(&client, Some("immutable"));
    let body = allocation("pod-1", "node-b", &[("GPU-cccc", 1024, 10)]);
    api.create(
        &PostParams::default(),
        &object::<VgpuAllocation>(body.clone()),
    )
    .await
    .unwrap();

    let changed = json!({"spec": {"nodeName": "node-c"}});
    let err = api
        .patch("pod-1", &PatchParams::default(), &Patch::Merge(changed))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("spec is immutable"), "{err}");

    let mut wrong_totals = allocation("pod-2", "node-b", &[("GPU-cccc", 1024, 10)]);
    wrong_totals["spec"]["totals"]["memoryMiB"] = json!(999);
    let message = refused(&api, object::<VgpuAllocation>(wrong_totals)).await;
    assert!(
        message.contains("totals.memoryMiB must equal the sum"),
        "{message}"
    );

    let twice = allocation(
        "pod-3",
        "node-b",
        &[("GPU-cccc", 1024, 10), ("GPU-cccc", 1024, 10)],
    );
    let message = refused(&api, object::<VgpuAllocation>(twice)).await;
    assert!(
        message.contains("at most one slice of each GPU"),
        "{message}"
    );

    let mut too_many_cores = allocation("pod-4", "node-b", &[("GPU-dddd", 1024, 150)]);
    too_many_cores["spec"]["totals"]["cores"] = json!(150);
    let message = refused(&api, object::<VgpuAllocation>(too_many_cores)).await;
    assert!(
        message.contains("cores must be at most 100 (percent of the device) except on AMD GPUs"),
        "{message}"
    );
    // AMD cores are compute units (304 on an MI300X); AWS Neuron devices
    // have no memory to share.
    let mut amd = allocation("pod-5", "node-b", &[("GPU-amd", 196608, 304)]);
    amd["spec"]["containers"][0]["devices"][0]["family"] = json!("amd");
    amd["spec"]["totals"]["families"] = json!("amd");
    api.create(&PostParams::default(), &object::<VgpuAllocation>(amd))
        .await
        .unwrap();
    let mut neuron = allocation("pod-6", "node-b", &[("n-AWSNeuron-0", 0, 1)]);
    neuron["spec"]["containers"][0]["devices"][0]["family"] = json!("awsneuron");
    neuron["spec"]["containers"][0]["devices"][0]["coreIndexes"] = json!([1]);
    neuron["spec"]["totals"]["families"] = json!("awsneuron");
    api.create(&PostParams::default(), &object::<VgpuAllocation>(neuron))
        .await
        .unwrap();
    let empty = allocation("pod-7", "node-b", &[("GPU-eeee", 0, 10)]);
    let message = refused(&api, object::<VgpuAllocation>(empty)).await;
    assert!(
        message.contains("memoryMiB must be at least 1 except on AWS Neuron devices"),
        "{message}"
    );
}

#[tokio::test]
async fn status_is_written_only_through_the_status_subresource() {
    let (_, client) = cluster().await;
    ensure_namespace(&client, "status").await;
    let api = dynamic::<VgpuAllocation>(&client, Some("status"));
    let typed: Api<VgpuAllocation> = Api::namespaced(client.clone(), "status");

    let mut body = allocation("pod-s", "node-s", &[("GPU-eeee", 2048, 20)]);
    body["status"] = json!({"phase": "Released"});
    let created = api
        .create(&PostParams::default(), &object::<VgpuAllocation>(body))
        .await
        .unwrap();
    // The status sent is dropped; what reads back is the CRD's default
    // (Bind's create is what makes an allocation Bound).
    assert_eq!(
        created.data.get("status"),
        Some(&json!({"phase": "Bound"})),
        "status on create must be dropped for the default: {created:?}"
    );

    typed
        .patch(
            "pod-s",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Released"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        typed
            .get("pod-s")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase),
        Some(AllocationPhase::Bound),
        "status through the main resource must be ignored"
    );

    let served = json!({"status": {"phase": "Allocated", "servedContainers": ["main"]}});
    typed
        .patch_status("pod-s", &PatchParams::default(), &Patch::Merge(served))
        .await
        .unwrap();
    let status = typed.get("pod-s").await.unwrap().status.unwrap();
    assert_eq!(status.phase, Some(AllocationPhase::Allocated));
    assert_eq!(status.served_containers, ["main"]);

    let bad_phase = json!({"status": {"phase": "Exploded"}});
    let err = typed
        .patch_status("pod-s", &PatchParams::default(), &Patch::Merge(bad_phase))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("status.phase") && err.contains("Unsupported value"),
        "{err}"
    );
}

#[tokio::test]
async fn node_lock_ttl_is_bounded_and_expiry_consistent() {
    let (_, client) = cluster().await;
    let api = dynamic::<NodeLock>(&client, None);
    let message = refused(
        &api,
        object::<NodeLock>(lock_body(
            "lock-zero",
            0,
            "2026-11-22T10:00:00Z",
            "2026-11-22T10:00:00Z",
        )),
    )
    .await;
    assert!(
        message.contains("spec.ttlSeconds") && message.contains("greater than or equal to 1"),
        "{message}"
    );
    let message = refused(
        &api,
        object::<NodeLock>(lock_body(
            "lock-long",
            301,
            "2026-11-22T10:00:00Z",
            "2026-11-22T10:05:01Z",
        )),
    )
    .await;
    assert!(
        message.contains("spec.ttlSeconds") && message.contains("less than or equal to 300"),
        "{message}"
    );
    let message = refused(
        &api,
        object::<NodeLock>(lock_body(
            "lock-skew",
            30,
            "2026-11-22T10:00:00Z",
            "2026-11-22T11:00:00Z",
        )),
    )
    .await;
    assert!(
        message.contains("expiresAt must equal acquiredAt + ttlSeconds"),
        "{message}"
    );
    api.create(
        &PostParams::default(),
        &object::<NodeLock>(lock_body(
            "lock-ok",
            300,
            "2026-11-22T10:00:00Z",
            "2026-11-22T10:05:00Z",
        )),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn allocations_can_be_listed_by_node() {
    let (_, client) = cluster().await;
    ensure_namespace(&client, "by-node").await;
    let api = dynamic::<VgpuAllocation>(&client, Some("by-node"));
    for (pod, node) in [("p1", "gpu-a"), ("p2", "gpu-b"), ("p3", "gpu-a")] {
        let body = allocation(pod, node, &[("GPU-ffff", 100, 1)]);
        api.create(&PostParams::default(), &object::<VgpuAllocation>(body))
            .await
            .unwrap();
    }
    let typed: Api<VgpuAllocation> = Api::namespaced(client.clone(), "by-node");
    let on_a = typed
        .list(&kube::api::ListParams::default().fields("spec.nodeName=gpu-a"))
        .await
        .unwrap();
    let mut names: Vec<_> = on_a.items.iter().map(|a| a.spec.pod_name.clone()).collect();
    names.sort();
    assert_eq!(names, ["p1", "p3"]);
}
