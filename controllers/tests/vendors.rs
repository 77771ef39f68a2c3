//! Other vendors' devices end to end with a real kube-apiserver and
//! kube-scheduler: Nodes annotated as HAMi's vendor plugins annotate them
//! become GpuNodes; Hygon and Ascend pods are placed with the vendors'
//! rules; Bind writes what those plugins read; the plugin's answer
//! (`hami.io/bind-phase: success`, the Node lock deleted) marks the
//! allocation Allocated and frees the node; broken or stale registrations
//! are reported and ignored.
//!
//! No node agent or kubelet here: [`plugin_serves`] does what HAMi's vendor
//! plugins do at Allocate (`PodAllocationTrySuccess` in
//! Project-HAMi/ascend-device-plugin and dcu-vgpu-device-plugin). The mock
//! plugins on real kubelets are in the e2e tests.

use tessera_testkit::cluster as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use support::{Cluster, WAIT};
use tessera_api::v1alpha1::{
    AllocationPhase, AppClass, DeviceFamily, GpuNode, NodeLock, QosPolicy, Sharing, VgpuAllocation,
};
use tessera_controllers::config::Config;
use tessera_scheduling::request::{
    AmdConfig, AwsNeuronConfig, CambriconConfig, EnflameConfig, HygonConfig, IluvatarConfig,
    KunlunConfig, MetaxConfig, MthreadsConfig, VnpuConfig, VnpuTemplate, VnpusConfig,
};

fn config() -> Config {
    let mut config = Config::default();
    config.request.hygon = Some(HygonConfig::default());
    config.request.vnpus = Some(VnpusConfig {
        hami_vnpu_core: false,
        configs: vec![VnpuConfig {
            chip_name: "910B4".into(),
            common_word: "Ascend910B4".into(),
            resource_name: "huawei.com/Ascend910B4".into(),
            resource_memory_name: "huawei.com/Ascend910B4-memory".into(),
            resource_core_name: "huawei.com/Ascend910B4-core".into(),
            memory_allocatable: 32768,
            memory_capacity: 32768,
            templates: vec![
                VnpuTemplate {
                    name: "vir05_1c_8g".into(),
                    memory: 8192,
                    ..VnpuTemplate::default()
                },
                VnpuTemplate {
                    name: "vir10_3c_16g".into(),
                    memory: 16384,
                    ..VnpuTemplate::default()
                },
            ],
            ..VnpuConfig::default()
        }],
    });
    config.request.cambricon = Some(CambriconConfig::default());
    config.request.mthreads = Some(MthreadsConfig::default());
    config.request.metax = Some(MetaxConfig::default());
    config.request.enflame = Some(EnflameConfig::default());
    config.request.amd = Some(AmdConfig::default());
    config.request.kunlun = Some(KunlunConfig::default());
    config.request.awsneuron = Some(AwsNeuronConfig::default());
    config.request.iluvatars = vec![IluvatarConfig {
        chip_name: "MR-V100".into(),
        common_word: "MR-V100".into(),
        resource_count_name: "iluvatar.ai/MR-V100-vgpu".into(),
        resource_memory_name: "iluvatar.ai/MR-V100.vMem".into(),
        resource_core_name: "iluvatar.ai/MR-V100.vCore".into(),
    }];
    config
}

const DCUS: &str =
    "DCU-a,4,16384,100,DCU-Z100,0,true,0,hami-core:DCU-b,4,16384,100,DCU-Z100,0,true,1,hami-core:";
const NPUS: &str = r#"[{"id":"NPU-a","index":0,"count":4,"devmem":32768,"devcore":20,"type":"Ascend910B4","health":true,"custominfo":{"NetworkID":0}},{"id":"NPU-b","index":1,"count":4,"devmem":32768,"devcore":20,"type":"Ascend910B4","health":true,"custominfo":{"NetworkID":0}}]"#;

/// A Ready Node as a vendor plugin leaves it: `annotations`, and the
/// plugin's resources in allocatable.
async fn vendor_node(cluster: &Cluster, name: &str, annotations: Value, allocatable: Value) {
    cluster.add_node(name, json!({})).await;
    patch_node(cluster, name, annotations).await;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let mut all = json!({"cpu": "64", "memory": "512Gi", "pods": "250"});
    all.as_object_mut()
        .unwrap()
        .extend(allocatable.as_object().unwrap().clone());
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": all.clone(), "capacity": all}})),
        )
        .await
        .unwrap();
}

async fn patch_node(cluster: &Cluster, name: &str, annotations: Value) {
    Api::<Node>::all(cluster.client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .unwrap();
}

/// Polls until `check` says yes, naming `what` when it never does.
async fn until<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn gpu_node(cluster: &Cluster, name: &str) -> Option<GpuNode> {
    Api::<GpuNode>::all(cluster.client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

fn ready(node: &GpuNode) -> Option<(String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone()))
}

async fn pod(cluster: &Cluster, name: &str) -> Pod {
    Api::<Pod>::namespaced(cluster.client.clone(), "default")
        .get(name)
        .await
        .unwrap()
}

async fn node_annotation(cluster: &Cluster, node: &str, key: &str) -> Option<String> {
    Api::<Node>::all(cluster.client.clone())
        .get(node)
        .await
        .unwrap()
        .annotations()
        .get(key)
        .cloned()
}

/// What HAMi's vendor plugins do at Allocate for the pod they find by
/// `hami.io/vgpu-node` and `bind-phase: allocating`: set `success`, delete
/// the Node's `hami.io/mutex.lock`.
async fn plugin_serves(cluster: &Cluster, name: &str) {
    let served = pod(cluster, name).await;
    let annotations = served.annotations();
    assert_eq!(annotations["hami.io/bind-phase"], "allocating");
    let node = annotations["hami.io/vgpu-node"].clone();
    Api::<Pod>::namespaced(cluster.client.clone(), "default")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"hami.io/bind-phase": "success"}}})),
        )
        .await
        .unwrap();
    patch_node(cluster, &node, json!({"hami.io/mutex.lock": null})).await;
}

async fn phase(cluster: &Cluster, name: &str) -> Option<AllocationPhase> {
    cluster.allocation(name).await.status.and_then(|s| s.phase)
}

/// Whether the node's NodeLock is free: gone, or released by its holder's
/// allocation (which the lifecycle controller marks `Allocated` once the
/// vendor's plugin says it served the pod).
async fn lock_free(cluster: &Cluster, node: &str) -> bool {
    let Some(lock) = Api::<NodeLock>::all(cluster.client.clone())
        .get_opt(node)
        .await
        .unwrap()
    else {
        return true;
    };
    let holder =
        Api::<VgpuAllocation>::namespaced(cluster.client.clone(), &lock.spec.holder.namespace)
            .get_opt(&lock.spec.allocation)
            .await
            .unwrap();
    !lock.held_among(holder.as_slice())
}

#[tokio::test]
async fn hygon_and_ascend_pods_are_placed_handed_off_and_served() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "dcu-1",
        json!({"hami.io/node-dcu-register": DCUS, "hami.io/node-handshake-dcu": "Reported_2026-11-27 10:00:00"}),
        json!({"hygon.com/dcunum": "8"}),
    )
    .await;
    vendor_node(
        &cluster,
        "npu-1",
        json!({"hami.io/node-register-Ascend910B4": NPUS}),
        json!({"huawei.com/Ascend910B4": "8"}),
    )
    .await;

    // The controller's view of each Node: a GpuNode owned by it, labelled.
    let dcu = until("a GpuNode for dcu-1", async || {
        gpu_node(&cluster, "dcu-1")
            .await
            .filter(|g| g.status.as_ref().is_some_and(|s| s.gpu_count == 2))
    })
    .await;
    assert_eq!(dcu.labels()["tessera.dev/gpunode-source"], "vendor-plugin");
    assert_eq!(dcu.owner_references()[0].kind, "Node");
    let status = dcu.status.unwrap();
    assert_eq!(
        (
            status.devices[0].family,
            status.devices[0].model.as_str(),
            status.models.as_str()
        ),
        (DeviceFamily::Hygon, "DCU-Z100", "DCU-Z100")
    );
    assert_eq!(
        ready(&gpu_node(&cluster, "dcu-1").await.unwrap())
            .unwrap()
            .0,
        "True"
    );
    // HAMi's handshake: the scheduler side asks, the plugin answers.
    let asked = until("a handshake request on npu-1", async || {
        node_annotation(&cluster, "npu-1", "hami.io/node-handshake-Ascend910B4").await
    })
    .await;
    assert!(asked.starts_with("Requesting_"), "{asked}");
    until("npu-1 in the projection", async || {
        cluster.projection.read().node("npu-1").map(|_| ())
    })
    .await;

    // A Hygon pod: placed on a DCU, the plugin's annotations written.
    cluster
        .create_pod(
            "dcu-pod",
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "4096", "hygon.com/dcucores": "30"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("dcu-pod").await, "dcu-1");
    let bound = pod(&cluster, "dcu-pod").await;
    let a = bound.annotations();
    assert_eq!(a["hami.io/vgpu-node"], "dcu-1");
    assert_eq!(a["hami.io/bind-phase"], "allocating");
    let handed = &a["hami.io/dcu-devices-to-allocate"];
    assert!(
        handed == "DCU-a,DCU,4096,30:;" || handed == "DCU-b,DCU,4096,30:;",
        "{handed}"
    );
    let mutex = node_annotation(&cluster, "dcu-1", "hami.io/mutex.lock")
        .await
        .unwrap();
    assert!(mutex.ends_with(",default,dcu-pod"), "{mutex}");
    let allocation = cluster.allocation("dcu-pod").await;
    assert_eq!(allocation.spec.totals.families, "hygon");
    assert_eq!(
        allocation.spec.containers[0].devices[0].family,
        DeviceFamily::Hygon
    );
    assert!(
        !lock_free(&cluster, "dcu-1").await,
        "the node stays locked until the plugin serves"
    );

    // The plugin serves: the allocation is Allocated and the node free.
    plugin_serves(&cluster, "dcu-pod").await;
    until("dcu-pod Allocated", async || {
        (phase(&cluster, "dcu-pod").await == Some(AllocationPhase::Allocated)).then_some(())
    })
    .await;
    until("dcu-1 unlocked", async || {
        lock_free(&cluster, "dcu-1").await.then_some(())
    })
    .await;

    // Ascend: 3000 MiB becomes the 8 GiB template, named to the plugin.
    cluster
        .create_pod(
            "npu-pod",
            json!({"huawei.com/Ascend910B4": "1", "huawei.com/Ascend910B4-memory": "3000"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("npu-pod").await, "npu-1");
    let a = pod(&cluster, "npu-pod").await.annotations().clone();
    let info: Value = serde_json::from_str(&a["huawei.com/Ascend910B4"]).unwrap();
    assert_eq!(info[0]["temp"], "vir05_1c_8g");
    assert_eq!(info[0]["memory"], 8192);
    assert!(a["hami.io/Ascend910B4-devices-to-allocate"].ends_with(",Ascend910B4,8192,0:;"));
    let allocation = cluster.allocation("npu-pod").await;
    let slice = &allocation.spec.containers[0].devices[0];
    assert_eq!(
        (slice.template.as_deref(), slice.memory_mib),
        (Some("vir05_1c_8g"), 8192)
    );
    plugin_serves(&cluster, "npu-pod").await;
    until("npu-1 unlocked", async || {
        lock_free(&cluster, "npu-1").await.then_some(())
    })
    .await;

    // A whole card fits on the other NPU; the next one waits, with the
    // vendor's words (the vNPU left 24 GiB of its NPU, not a whole card).
    cluster
        .create_pod("card-1", json!({"huawei.com/Ascend910B4": "1"}), json!({}))
        .await;
    assert_eq!(cluster.node_of("card-1").await, "npu-1");
    assert_ne!(
        cluster.allocation("card-1").await.spec.totals.devices,
        cluster.allocation("npu-pod").await.spec.totals.devices
    );
    plugin_serves(&cluster, "card-1").await;
    until("npu-1 unlocked", async || {
        lock_free(&cluster, "npu-1").await.then_some(())
    })
    .await;
    cluster
        .create_pod("card-2", json!({"huawei.com/Ascend910B4": "1"}), json!({}))
        .await;
    let reasons = cluster.failed_scheduling("card-2").await.join("\n");
    assert!(
        reasons.contains("needs 1 Ascend910B4 NPU with 32768 MiB and 0 cores; 0 of 2 Ascend910B4 NPUs fit: 2 Ascend910B4 NPUs without 32768 MiB free (largest free is 24576 MiB on"),
        "{reasons}"
    );
}

#[tokio::test]
async fn an_iluvatar_pod_is_placed_on_its_chip_and_handed_off() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "ilu-1",
        json!({"hami.io/node-MR-V100-register": "ILU-a,4,32768,100,MR-V100,0,true,0,hami-core:"}),
        json!({"iluvatar.ai/MR-V100-vgpu": "4"}),
    )
    .await;
    until("ilu-1 in the projection", async || {
        cluster.projection.read().node("ilu-1").map(|_| ())
    })
    .await;
    cluster
        .create_pod(
            "ilu-pod",
            json!({"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "16", "iluvatar.ai/MR-V100.vCore": "25"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("ilu-pod").await, "ilu-1");
    let a = pod(&cluster, "ilu-pod").await.annotations().clone();
    assert_eq!(
        a["hami.io/MR-V100-devices-to-allocate"],
        "ILU-a,MR-V100,4096,25:;"
    );
    assert_eq!(
        cluster.allocation("ilu-pod").await.spec.totals.families,
        "iluvatar"
    );
    plugin_serves(&cluster, "ilu-pod").await;
    until("ilu-1 unlocked", async || {
        lock_free(&cluster, "ilu-1").await.then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_cambricon_node_is_read_from_its_allocatable_and_its_pod_gets_a_profile() {
    let cluster = Cluster::start(config()).await;
    // What Cambricon's plugin advertises for two MLUs of 16 GiB: 100 vcores
    // and 64 units of 256 MiB each.
    vendor_node(
        &cluster,
        "mlu-1",
        json!({}),
        json!({"cambricon.com/vmlu": "200", "cambricon.com/mlu.smlu.vcore": "200", "cambricon.com/mlu.smlu.vmemory": "128"}),
    )
    .await;
    let node = until("mlu-1's GpuNode", async || {
        gpu_node(&cluster, "mlu-1")
            .await
            .filter(|g| g.status.as_ref().is_some_and(|s| s.gpu_count == 2))
    })
    .await;
    let device = &node.status.unwrap().devices[1];
    assert_eq!(
        (
            device.uuid.as_str(),
            device.capacity.memory_mib,
            device.split_count
        ),
        ("mlu-1-cambricon-mlu-1", 16384, 100)
    );
    until("mlu-1 in the projection", async || {
        cluster.projection.read().node("mlu-1").map(|_| ())
    })
    .await;
    cluster
        .create_pod(
            "mlu-pod",
            json!({"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "8", "cambricon.com/mlu.smlu.vcore": "40"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("mlu-pod").await, "mlu-1");
    let a = pod(&cluster, "mlu-pod").await.annotations().clone();
    let profile = &a["CAMBRICON_DSMLU_PROFILE"];
    assert!(profile == "0_40_8" || profile == "1_40_8", "{profile}");
    assert_eq!(a["CAMBRICON_DSMLU_ASSIGNED"], "false");
    assert_eq!(a["CAMBRICON_DSMLU_ASSIGHED"], "false");
    assert!(a["hami.io/cambricon-mlu-devices-to-allocate"].ends_with(",MLU,2048,40:;"));
    let lock = node_annotation(&cluster, "mlu-1", "cambricon.com/dsmlu.lock").await;
    assert!(
        lock.is_some_and(|t| t.ends_with('Z')),
        "Cambricon's own node lock is taken"
    );
    assert_eq!(
        node_annotation(&cluster, "mlu-1", "hami.io/mutex.lock").await,
        None,
        "Cambricon's plugin does not use HAMi's mutex"
    );
    assert_eq!(
        cluster.allocation("mlu-pod").await.spec.totals.families,
        "cambricon"
    );
}

#[tokio::test]
async fn a_moore_threads_pod_keeps_its_containers_on_one_card() {
    let cluster = Cluster::start(config()).await;
    // Two cards as Moore Threads' plugin advertises them: 16 cores and 96
    // memory units (512 MiB) each.
    vendor_node(
        &cluster,
        "mt-1",
        json!({}),
        json!({"mthreads.com/vgpu": "2", "mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "192"}),
    )
    .await;
    until("mt-1 in the projection", async || {
        cluster
            .projection
            .read()
            .node("mt-1")
            .filter(|n| n.devices.len() == 2)
            .map(|_| ())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let slice = json!({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "4"});
    let manifest: Pod = serde_json::from_value(json!({
        "metadata": {"name": "mt-pod"},
        "spec": {
            "schedulerName": "tessera-scheduler",
            "containers": [
                {"name": "a", "image": "example.invalid/x", "resources": {"limits": slice}},
                {"name": "b", "image": "example.invalid/x", "resources": {"limits": slice}},
            ],
        },
    }))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &manifest)
        .await
        .unwrap();
    assert_eq!(cluster.node_of("mt-pod").await, "mt-1");
    let allocation = cluster.allocation("mt-pod").await;
    assert_eq!(allocation.spec.totals.families, "mthreads");
    let cards: Vec<&str> = allocation
        .spec
        .containers
        .iter()
        .map(|c| c.devices[0].uuid.as_str())
        .collect();
    assert_eq!(cards.len(), 2);
    assert_eq!(cards[0], cards[1], "one card per pod");
    let a = pod(&cluster, "mt-pod").await.annotations().clone();
    assert_eq!(a["hami.io/vgpu-node"], "mt-1");
    assert_eq!(a["mthreads.com/predicate-node"], "mt-1");
    assert!(a["mthreads.com/gpu-index"] == "0" || a["mthreads.com/gpu-index"] == "1");
    assert_eq!(
        node_annotation(&cluster, "mt-1", "hami.io/mutex.lock").await,
        None
    );
}

#[tokio::test]
async fn a_metax_exclusive_pod_gets_one_metalink_and_its_hand_off() {
    let cluster = Cluster::start(config()).await;
    // Three GPUs as MetaX's sGPU plugin lists them: two on MetaLink 1, one
    // on none; four sGPUs of 16 GiB each.
    let list = json!([
        {"uuid": "GPU-a", "totalDevCount": 4, "totalCompute": 100, "totalVRam": 16384, "healthy": true},
        {"uuid": "GPU-b", "totalDevCount": 4, "totalCompute": 100, "totalVRam": 16384, "healthy": true, "linkZone": 1},
        {"uuid": "GPU-c", "totalDevCount": 4, "totalCompute": 100, "totalVRam": 16384, "healthy": true, "linkZone": 1},
    ]);
    vendor_node(
        &cluster,
        "mx-1",
        json!({"metax-tech.com/node-gpu-devices": list.to_string()}),
        json!({"metax-tech.com/sgpu": "12"}),
    )
    .await;
    until("mx-1 in the projection", async || {
        cluster
            .projection
            .read()
            .node("mx-1")
            .filter(|n| n.devices.len() == 3)
            .map(|_| ())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let manifest: Pod = serde_json::from_value(json!({
        "metadata": {"name": "mx-pod"},
        "spec": {
            "schedulerName": "tessera-scheduler",
            "containers": [{"name": "main", "image": "example.invalid/x",
                "resources": {"limits": {"metax-tech.com/sgpu": "2"}}}],
        },
    }))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &manifest)
        .await
        .unwrap();
    assert_eq!(cluster.node_of("mx-pod").await, "mx-1");
    let allocation = cluster.allocation("mx-pod").await;
    assert_eq!(allocation.spec.totals.families, "metax");
    let mut gpus: Vec<&str> = allocation.spec.containers[0]
        .devices
        .iter()
        .map(|d| d.uuid.as_str())
        .collect();
    gpus.sort_unstable();
    assert_eq!(gpus, ["GPU-b", "GPU-c"], "both on MetaLink 1");
    let a = pod(&cluster, "mx-pod").await.annotations().clone();
    assert_eq!(a["hami.io/vgpu-node"], "mx-1");
    assert_eq!(a["hami.io/bind-phase"], "allocating");
    assert_eq!(
        a["hami.io/metax-sgpu-devices-to-allocate"],
        a["hami.io/metax-sgpu-devices-allocated"]
    );
    let listed: serde_json::Value =
        serde_json::from_str(&a["metax-tech.com/gpu-devices-allocated"]).unwrap();
    assert_eq!(listed[0].as_array().unwrap().len(), 2);
    assert_eq!(listed[0][0]["compute"], 100);
    assert_eq!(listed[0][0]["vRam"], 16384);
    assert!(a.contains_key("metax-tech.com/predicate-time"));
    let lock = node_annotation(&cluster, "mx-1", "hami.io/mutex.lock")
        .await
        .expect("the sGPU plugin finds the pod through the Node lock");
    assert!(lock.ends_with(",default,mx-pod"), "{lock}");
}

#[tokio::test]
async fn metax_app_classes_and_qos_policies_decide_who_shares_a_gpu() {
    let cluster = Cluster::start(config()).await;
    // One GPU of four sGPUs whose plugin reports burst-share.
    let list = json!([{"uuid": "GPU-q", "totalDevCount": 4, "totalCompute": 100,
        "totalVRam": 16384, "healthy": true, "qosPolicy": "burst-share"}]);
    vendor_node(
        &cluster,
        "mx-q",
        json!({"metax-tech.com/node-gpu-devices": list.to_string()}),
        json!({"metax-tech.com/sgpu": "4"}),
    )
    .await;
    until("mx-q in the projection", async || {
        cluster.projection.read().node("mx-q").map(|_| ())
    })
    .await;
    let sgpu = json!({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "30", "metax-tech.com/vmemory": "2"});
    let offline = json!({"metax-tech.com/sgpu-app-class": "offline", "metax-tech.com/sgpu-qos-policy": "fixed-share"});
    cluster
        .create_pod("offline-a", sgpu.clone(), offline.clone())
        .await;
    assert_eq!(cluster.node_of("offline-a").await, "mx-q");
    let slice = &cluster.allocation("offline-a").await.spec.containers[0].devices[0];
    assert_eq!(
        slice.sharing,
        Some(Sharing {
            app_class: Some(AppClass::Offline),
            qos_policy: Some(QosPolicy::FixedShare),
        }),
        "the allocation keeps the pod's class and policy for the ledger"
    );
    plugin_serves(&cluster, "offline-a").await;
    until("offline-a allocated", async || {
        (phase(&cluster, "offline-a").await == Some(AllocationPhase::Allocated)).then_some(())
    })
    .await;

    // A pod without an app class may not share a GPU of offline pods.
    cluster.create_pod("normal", sgpu.clone(), json!({})).await;
    let reasons = cluster.failed_scheduling("normal").await;
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("running online or offline pods")),
        "{reasons:?}"
    );
    // An offline pod of another QoS policy neither (the holders decide,
    // not the plugin's stale burst-share).
    let other = json!({"metax-tech.com/sgpu-app-class": "offline", "metax-tech.com/sgpu-qos-policy": "best-effort"});
    cluster.create_pod("offline-b", sgpu.clone(), other).await;
    let reasons = cluster.failed_scheduling("offline-b").await;
    assert!(
        reasons.iter().any(|r| r
            .contains("another QoS policy than metax-tech.com/sgpu-qos-policy \"best-effort\"")),
        "{reasons:?}"
    );
    // An online pod joins, charged no cores.
    cluster
        .create_pod(
            "online",
            sgpu.clone(),
            json!({"metax-tech.com/sgpu-app-class": "online"}),
        )
        .await;
    assert_eq!(cluster.node_of("online").await, "mx-q");
    assert_eq!(
        cluster.allocation("online").await.spec.containers[0].devices[0].cores,
        0
    );
    let handed = pod(&cluster, "online").await;
    let listed: serde_json::Value =
        serde_json::from_str(&handed.annotations()["metax-tech.com/gpu-devices-allocated"])
            .unwrap();
    assert_eq!(listed[0][0]["vRam"], 2048);
    assert!(
        listed[0][0].get("compute").is_none_or(|c| c == 0),
        "an online sGPU is handed no compute share: {listed}"
    );
    plugin_serves(&cluster, "online").await;
    // Now the GPU runs an online pod: a further offline pod waits.
    cluster.create_pod("offline-c", sgpu, offline).await;
    let reasons = cluster.failed_scheduling("offline-c").await;
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("online pods, which take no offline pod")),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn enflame_whole_gcus_are_read_from_the_node_and_handed_off() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "gcu-1",
        json!({}),
        json!({"enflame.com/gcu": "2"}),
    )
    .await;
    until("gcu-1 in the projection", async || {
        cluster
            .projection
            .read()
            .node("gcu-1")
            .filter(|n| n.devices.len() == 2)
            .map(|_| ())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let manifest: Pod = serde_json::from_value(json!({
        "metadata": {"name": "gcu-pod"},
        "spec": {
            "schedulerName": "tessera-scheduler",
            "containers": [{"name": "main", "image": "example.invalid/x",
                "resources": {"limits": {"enflame.com/gcu": "2"}}}],
        },
    }))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &manifest)
        .await
        .unwrap();
    assert_eq!(cluster.node_of("gcu-pod").await, "gcu-1");
    let allocation = cluster.allocation("gcu-pod").await;
    assert_eq!(allocation.spec.totals.families, "enflame");
    let a = pod(&cluster, "gcu-pod").await.annotations().clone();
    assert_eq!(
        a["hami.io/enflame-gcu-devices-to-allocate"],
        "gcu-1-GCU-0,GCU,100,100:gcu-1-GCU-1,GCU,100,100:;"
    );
    assert_eq!(
        node_annotation(&cluster, "gcu-1", "hami.io/mutex.lock").await,
        None
    );
}

#[tokio::test]
async fn kunlunxin_whole_xpus_and_vxpus_are_placed_by_wing_and_handed_off() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "xpu-1",
        json!({}),
        json!({"kunlunxin.com/xpu": "8"}),
    )
    .await;
    let vxpus: Vec<Value> = (0..8)
        .map(|i| json!({"id": format!("vxpu-{i}"), "index": i, "count": 4, "devmem": 98304, "devcore": 100, "type": "P800", "health": true}))
        .collect();
    vendor_node(
        &cluster,
        "vxpu-1",
        json!({"hami.io/node-register-xpu": Value::Array(vxpus).to_string(), "hami.io/node-handshake-xpu": "Reported_2026-11-27 10:00:00"}),
        json!({"kunlunxin.com/vxpu": "32"}),
    )
    .await;
    until("both Kunlunxin nodes in the projection", async || {
        let projection = cluster.projection.read();
        let xpus = projection.node("xpu-1").map(|n| n.devices.len());
        let vxpus = projection.node("vxpu-1").map(|n| n.devices.len());
        (xpus == Some(8) && vxpus == Some(8)).then_some(())
    })
    .await;
    cluster
        .create_pod("xpu-pod", json!({"kunlunxin.com/xpu": "4"}), json!({}))
        .await;
    assert_eq!(cluster.node_of("xpu-pod").await, "xpu-1");
    let a = pod(&cluster, "xpu-pod").await.annotations().clone();
    assert_eq!(a["BAIDU_COM_DEVICE_IDX"], "0,1,2,3", "one whole wing");
    assert!(
        a["hami.io/kunlun-allocated"].starts_with("xpu-1-kunlun-0,kunlun,98304,100:"),
        "{a:?}"
    );
    assert_eq!(
        node_annotation(&cluster, "xpu-1", "hami.io/mutex.lock").await,
        None,
        "HAMi takes no lock for whole XPUs"
    );
    cluster
        .create_pod(
            "vxpu-pod",
            json!({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "20000"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("vxpu-pod").await, "vxpu-1");
    let allocation = cluster.allocation("vxpu-pod").await;
    assert_eq!(allocation.spec.totals.families, "kunlunxin");
    let slice = &allocation.spec.containers[0].devices[0];
    assert_eq!((slice.memory_mib, slice.cores), (24576, 25));
    let a = pod(&cluster, "vxpu-pod").await.annotations().clone();
    assert_eq!(
        a["hami.io/xpu-devices-to-allocate"],
        format!("{},XPU,24576,25:;", slice.uuid)
    );
    let lock = node_annotation(&cluster, "vxpu-1", "hami.io/mutex.lock")
        .await
        .expect("the vXPU plugin finds the pod through the Node lock");
    assert!(lock.ends_with(",default,vxpu-pod"), "{lock}");
    plugin_serves(&cluster, "vxpu-pod").await;
    until("vxpu-pod Allocated", async || {
        (phase(&cluster, "vxpu-pod").await == Some(AllocationPhase::Allocated)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn aws_neuron_pods_get_devices_or_cores_by_index() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "inf-1",
        json!({}),
        json!({"aws.amazon.com/neuron": "4", "aws.amazon.com/neuroncore": "8"}),
    )
    .await;
    Api::<Node>::all(cluster.client.clone())
        .patch(
            "inf-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": "inf2.24xlarge"}}})),
        )
        .await
        .unwrap();
    until("inf-1 in the projection as inf2", async || {
        cluster
            .projection
            .read()
            .node("inf-1")
            .filter(|n| n.devices.len() == 4 && n.devices[0].model == "inf2.24xlarge")
            .map(|_| ())
    })
    .await;
    cluster
        .create_pod(
            "one-core",
            json!({"aws.amazon.com/neuroncore": "1"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("one-core").await, "inf-1");
    let held = cluster.allocation("one-core").await.spec.containers[0].devices[0].clone();
    assert_eq!(
        (held.memory_mib, held.cores, held.core_indexes.clone()),
        (0, 1, vec![0])
    );
    let a = pod(&cluster, "one-core").await.annotations().clone();
    assert_eq!(a["AWS_NEURON_IDS"], (held.index * 2).to_string());
    assert_eq!(a["NEURON_RESOURCE_TYPE"], "aws.amazon.com/neuroncore");
    assert_eq!(a["NEURON_ALLOCATED"], "false");
    // AWS's plugin does not answer HAMi's bind-phase: the node's lock goes
    // when the kubelet starts the pod's containers.
    Api::<Pod>::namespaced(cluster.client.clone(), "default")
        .patch_status(
            "one-core",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "containerStatuses": [
                {"name": "main", "ready": true, "restartCount": 0, "image": "i", "imageID": "", "state": {"running": {}}}
            ]}})),
        )
        .await
        .unwrap();
    until("inf-1 unlocked", async || {
        lock_free(&cluster, "inf-1").await.then_some(())
    })
    .await;
    // By count: two consecutive free devices.
    cluster
        .create_pod(
            "two-devices",
            json!({"aws.amazon.com/neuron": "2"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("two-devices").await, "inf-1");
    let spec = cluster.allocation("two-devices").await.spec;
    let indexes: Vec<u32> = spec.containers[0].devices.iter().map(|d| d.index).collect();
    assert_eq!(indexes.len(), 2);
    assert_eq!(
        indexes[1],
        indexes[0] + 1,
        "consecutive devices: {indexes:?}"
    );
    assert!(!indexes.contains(&held.index));
    let a = pod(&cluster, "two-devices").await.annotations().clone();
    assert_eq!(
        a["AWS_NEURON_IDS"],
        format!("{},{}", indexes[0], indexes[1])
    );
    assert_eq!(
        node_annotation(&cluster, "inf-1", "hami.io/mutex.lock").await,
        None,
        "HAMi takes no lock for Neuron"
    );
}

const AMD_GPUS: &str = r#"[{"id":"GPU-0","index":0,"count":4,"devmem":196608,"devcore":304,"type":"AMD Instinct MI300X VF","numa":0,"mode":"hami-core","health":true},{"id":"GPU-1","index":1,"count":4,"devmem":196608,"devcore":304,"type":"AMD Instinct MI300X VF","numa":0,"mode":"hami-core","health":true}]"#;

#[tokio::test]
async fn an_amd_pod_gets_compute_units_and_its_hand_off_under_the_lock() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "amd-1",
        json!({"hami.io/node-amd-register": AMD_GPUS}),
        json!({"amd.com/gpu": "2"}),
    )
    .await;
    until("amd-1 in the projection", async || {
        cluster
            .projection
            .read()
            .node("amd-1")
            .filter(|n| n.devices.len() == 2)
            .map(|_| ())
    })
    .await;
    cluster
        .create_pod(
            "amd-pod",
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "16384", "amd.com/gpucores": "25"}),
            json!({"amd.com/use-gputype": "MI300X"}),
        )
        .await;
    assert_eq!(cluster.node_of("amd-pod").await, "amd-1");
    let allocation = cluster.allocation("amd-pod").await;
    assert_eq!(allocation.spec.totals.families, "amd");
    let slice = &allocation.spec.containers[0].devices[0];
    assert_eq!(
        (slice.memory_mib, slice.cores),
        (16384, 76),
        "25% of 304 CUs"
    );
    let a = pod(&cluster, "amd-pod").await.annotations().clone();
    let want = format!("{},AMD Instinct MI300X VF,16384,76:;", slice.uuid);
    assert_eq!(a["hami.io/amd-devices-to-allocate"], want);
    assert_eq!(a["hami.io/amd-devices-allocated"], want);
    let lock = node_annotation(&cluster, "amd-1", "hami.io/mutex.lock")
        .await
        .expect("HAMi's AMD LockNode takes hami.io/mutex.lock");
    assert!(lock.ends_with(",default,amd-pod"), "{lock}");
    plugin_serves(&cluster, "amd-pod").await;
    until("amd-pod Allocated", async || {
        (phase(&cluster, "amd-pod").await == Some(AllocationPhase::Allocated)).then_some(())
    })
    .await;
    // 100 % is every compute unit: 304, which the CRD takes on AMD GPUs,
    // and only the GPU nobody shares has them.
    cluster
        .create_pod(
            "amd-whole",
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "100"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("amd-whole").await, "amd-1");
    let whole = cluster.allocation("amd-whole").await;
    let taken = &whole.spec.containers[0].devices[0];
    assert_eq!((taken.memory_mib, taken.cores), (196608, 304));
    assert_ne!(taken.uuid, slice.uuid);
    // The plugin goes (the Node stops advertising amd.com/gpu): HAMi's
    // CheckHealth drops the devices.
    Api::<Node>::all(cluster.client.clone())
        .patch_status(
            "amd-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {"amd.com/gpu": "0"}, "capacity": {"amd.com/gpu": "0"}}})),
        )
        .await
        .unwrap();
    until("amd-1 DevicePluginGone", async || {
        let node = gpu_node(&cluster, "amd-1").await?;
        (ready(&node)? == ("False".to_owned(), "DevicePluginGone".to_owned())).then_some(())
    })
    .await;
}

#[tokio::test]
async fn enflame_drs_partitions_are_cut_by_profile_and_handed_off() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "drs-1",
        json!({"enflame.com/gcu-drs-capacity": r#"{"devices":[{"index":"0","minor":"7","capacity":6}],"profiles":{"1g.6gb":"p1","3g.20gb":"p3","6g.40gb":"p6"}}"#}),
        json!({"enflame.com/drs-gcu": "6"}),
    )
    .await;
    until("drs-1 in the projection", async || {
        cluster
            .projection
            .read()
            .node("drs-1")
            .filter(|n| n.devices.first().is_some_and(|d| d.profiles.len() == 3))
            .map(|_| ())
    })
    .await;
    cluster
        .create_pod(
            "drs-pod",
            json!({"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "40"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("drs-pod").await, "drs-1");
    let slice = cluster.allocation("drs-pod").await.spec.containers[0].devices[0].clone();
    assert_eq!(
        (slice.template.as_deref(), slice.memory_mib, slice.cores),
        (Some("3g.20gb"), 20480, 50)
    );
    let a = pod(&cluster, "drs-pod").await.annotations().clone();
    assert_eq!(
        a["hami.io/enflame-vgpu-devices-allocated"],
        "drs-1-enflame-drs-0,Enflame,20480,50:;"
    );
    assert_eq!(a["enflame.com/gcu-assigned-minor"], "7");
    assert_eq!(a["enflame.com/gcu-request-size"], "3");
    assert_eq!(
        a["assigned-containers"],
        r#"{"main":{"allocated":false,"request":3,"profileID":"p3","profileName":"3g.20gb"}}"#
    );
    // The ledger counts the partition's three slices: a 6g partition no
    // longer fits.
    let request = tessera_scheduling::request::parse_pod(
        &serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {"containers": [
            {"name": "main", "resources": {"limits": {"enflame.com/drs-gcu": "6"}}}]}}))
        .unwrap(),
        &config().request,
    )
    .unwrap()
    .unwrap();
    let projection = cluster.projection.read();
    let node = projection.node("drs-1").unwrap();
    assert_eq!(node.usage[0].slices, 3);
    let err = tessera_controllers::engine::fit(
        node,
        &request,
        tessera_api::v1alpha1::SchedulingPolicy::Binpack,
    )
    .unwrap_err();
    assert!(err.to_string().contains("1 DRS GCU"), "{err}");
}

#[tokio::test]
async fn a_plugins_pending_pod_keeps_its_mutex_lock_even_when_tesseras_lock_lapsed() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "dcu-3",
        json!({"hami.io/node-dcu-register": DCUS}),
        json!({"hygon.com/dcunum": "8"}),
    )
    .await;
    until("dcu-3 in the projection", async || {
        cluster.projection.read().node("dcu-3").map(|_| ())
    })
    .await;
    let small =
        json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "1024", "hygon.com/dcucores": "10"});
    cluster.create_pod("first", small.clone(), json!({})).await;
    assert_eq!(cluster.node_of("first").await, "dcu-3");
    // The kubelet is slow: Tessera's NodeLock lapses (here: deleted) while
    // the plugin has not served `first` yet.
    Api::<NodeLock>::all(cluster.client.clone())
        .delete("dcu-3", &Default::default())
        .await
        .unwrap();
    cluster.create_pod("second", small, json!({})).await;
    let reasons = cluster.failed_scheduling("second").await.join("\n");
    assert!(
        reasons.contains("hami.io/mutex.lock is held by default/first, which the vendor's device plugin has not served yet"),
        "{reasons}"
    );
    let lock = node_annotation(&cluster, "dcu-3", "hami.io/mutex.lock")
        .await
        .unwrap();
    assert!(lock.ends_with(",default,first"), "{lock}");
    // Once the plugin serves `first`, `second` binds.
    plugin_serves(&cluster, "first").await;
    assert_eq!(cluster.node_of("second").await, "dcu-3");
}

#[tokio::test]
async fn a_pod_of_two_vendors_gets_both_on_one_node() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "both-1",
        json!({"hami.io/node-dcu-register": DCUS, "hami.io/node-register-Ascend910B4": NPUS}),
        json!({"hygon.com/dcunum": "8", "huawei.com/Ascend910B4": "8"}),
    )
    .await;
    until("both-1 with 4 devices", async || {
        cluster
            .projection
            .read()
            .node("both-1")
            .filter(|n| n.devices.len() == 4)
            .map(|_| ())
    })
    .await;
    cluster
        .create_pod(
            "two",
            json!({"hygon.com/dcunum": "1", "hygon.com/dcumem": "1024", "huawei.com/Ascend910B4": "1", "huawei.com/Ascend910B4-memory": "8192"}),
            json!({}),
        )
        .await;
    assert_eq!(cluster.node_of("two").await, "both-1");
    let allocation = cluster.allocation("two").await;
    assert_eq!(allocation.spec.totals.families, "ascend,hygon");
    assert_eq!(
        allocation.spec.containers.len(),
        1,
        "one container, slices of both families"
    );
    let a = pod(&cluster, "two").await.annotations().clone();
    assert!(a.contains_key("hami.io/dcu-devices-to-allocate"));
    assert!(a.contains_key("huawei.com/Ascend910B4"));
    plugin_serves(&cluster, "two").await;
    until("two Allocated", async || {
        (phase(&cluster, "two").await == Some(AllocationPhase::Allocated)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn malformed_and_stale_registrations_are_reported_and_ignored() {
    let cluster = Cluster::start(config()).await;
    vendor_node(
        &cluster,
        "dcu-2",
        json!({"hami.io/node-dcu-register": "DCU-x,4,oops,100,DCU,0,true:"}),
        json!({}),
    )
    .await;
    let broken = until("dcu-2 marked not ready", async || {
        gpu_node(&cluster, "dcu-2")
            .await
            .filter(|g| ready(g).is_some())
    })
    .await;
    assert_eq!(
        ready(&broken).unwrap(),
        ("False".to_owned(), "RegisterAnnotationMalformed".to_owned())
    );
    assert_eq!(broken.status.unwrap().gpu_count, 0, "no device guessed");
    let events = until("a Warning event on dcu-2", async || {
        let list = Api::<Event>::namespaced(cluster.client.clone(), "default")
            .list(&ListParams::default().fields("involvedObject.name=dcu-2"))
            .await
            .unwrap();
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("MalformedRegisterAnnotation"))
    })
    .await;
    let message = events.message.unwrap();
    assert!(
        message.contains("annotation hami.io/node-dcu-register device 0: devmem \"oops\" is not a non-negative whole number"),
        "{message}"
    );

    // Fixed by the plugin: the devices appear.
    patch_node(
        &cluster,
        "dcu-2",
        json!({"hami.io/node-dcu-register": DCUS}),
    )
    .await;
    until("dcu-2 with its DCUs", async || {
        gpu_node(&cluster, "dcu-2")
            .await
            .filter(|g| g.status.as_ref().is_some_and(|s| s.gpu_count == 2))
    })
    .await;

    // The plugin stops answering: a Requesting over 60 s old, nothing advertised.
    let old = "Requesting_2020-01-01 00:00:00";
    patch_node(
        &cluster,
        "dcu-2",
        json!({"hami.io/node-handshake-dcu": old}),
    )
    .await;
    let expired = until("dcu-2 expired", async || {
        gpu_node(&cluster, "dcu-2")
            .await
            .filter(|g| ready(g).is_some_and(|r| r.1 == "HandshakeExpired"))
    })
    .await;
    assert_eq!(expired.status.unwrap().gpu_count, 0);
    cluster
        .create_pod("late", json!({"hygon.com/dcunum": "1"}), json!({}))
        .await;
    let reasons = cluster.failed_scheduling("late").await.join("\n");
    assert!(reasons.contains("HandshakeExpired: the device plugin has not answered the hami.io/node-handshake-dcu handshake"), "{reasons}");

    // The annotations go: so does the GpuNode.
    patch_node(
        &cluster,
        "dcu-2",
        json!({"hami.io/node-dcu-register": null, "hami.io/node-handshake-dcu": null}),
    )
    .await;
    until("dcu-2's GpuNode deleted", async || {
        gpu_node(&cluster, "dcu-2").await.is_none().then_some(())
    })
    .await;
}
