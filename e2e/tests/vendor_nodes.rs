//! Other vendors on real kubelets beside an NVIDIA node: an Ascend node, a
//! Hygon node, an AMD node, an Iluvatar node, a Kunlunxin node and a MetaX
//! node, each
//! served by a mock of its vendor's device plugin
//! (`tessera-mock-vendor-plugin`, registered with the node's real kubelet),
//! Tessera installed by its chart with HAMi's `hygon:`, `amd:`, `kunlun:`,
//! `metax:`, `iluvatars:` and `vnpus:` sections. Two AMD pods share one GPU's compute
//! units without overlap.
//! Pods of each family run with the vendor's variables, are recorded in one
//! ledger (`kubectl get vgpuallocations` shows them side by side), wait with
//! the vendor's reason when nothing fits, and release; a malformed register
//! annotation is reported and the plugin's next pass repairs it. The
//! second test's first node is mixed: an NVIDIA GPU under Tessera's agent
//! and Ascend NPUs under the mock plugin, on one kubelet. The third serves
//! Vastai dies (grouped by card, HAMi's die mode and `mutex`) and whole
//! Biren GPUs through mocks of their plugins.
//!
//! Needs what the real-node tests need; `TESSERA_SKIP_REAL_NODES=1` skips it.

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use std::time::Duration;
use tessera_api::v1alpha1::{GpuNode, VgpuAllocation};
use tessera_e2e::{
    Lifetime,
    artifacts::Artifacts,
    cluster::{LocalCluster, NodeGpus},
    mock_vendor::{
        MockDevice, Vendor, amd_mi300x, ascend_910b4, biren_gpus, cambricon_mlu370, chart_values,
        enflame_gcus, enflame_s60, hygon_dcus, iluvatar_mr_v100, kunlunxin_whole_xpus,
        kunlunxin_xpus, metax_c500, metax_gpus, mthreads_s4000, neuron_devices, vastai_dies,
    },
    node::FakeGpu,
    testkit::{self, gpu_pod, phase, pod_with_limits, scheduling_failure, wait_for},
};

const LIMIT: Duration = Duration::from_secs(120);

/// A pod printing its environment, with `limits`.
fn vendor_pod(name: &str, limits: Value) -> Pod {
    serde_json::from_value(pod_with_limits(
        name,
        limits,
        "env | sort; echo END; sleep 3600",
    ))
    .unwrap()
}

async fn logs_when_done(cluster: &LocalCluster, name: &str) -> String {
    wait_for(
        &format!("{name} to print its environment"),
        LIMIT,
        async || {
            let out = cluster.plane.logs("default", name).ok()?;
            out.contains("END").then_some(out)
        },
    )
    .await
}

/// Waits for `name`'s allocation to be Allocated (served by its plugin).
async fn allocated(client: &Client, name: &str) -> VgpuAllocation {
    testkit::allocated(client, "default", name, LIMIT).await
}

/// Waits for `node`'s GpuNode to list `count` devices of `family`; returns
/// the first device's memory.
async fn vendor_gpu_node(client: &Client, node: &str, family: &str, count: u32) -> u64 {
    wait_for(&format!("{node}'s GpuNode"), LIMIT, async || {
        let g = Api::<GpuNode>::all(client.clone())
            .get_opt(node)
            .await
            .ok()??;
        let status = g.status?;
        let first = status.devices.first()?;
        (status.gpu_count == count && first.family.as_str() == family).then_some(first.memory_mib)
    })
    .await
}

/// The NVIDIA node beside the vendors' (one fake L4).
fn nvidia_node() -> NodeGpus {
    NodeGpus {
        name: "gpu-1".into(),
        gpus: FakeGpu::many("gpu1", 1, "NVIDIA L4", 23034, 1),
        ..Default::default()
    }
}

/// A mixed node: an NVIDIA L4 under Tessera's agent and two Ascend 910B4
/// NPUs under the mock of HAMi's Ascend plugin, on one kubelet.
fn mixed_node() -> NodeGpus {
    NodeGpus {
        name: "mix-1".into(),
        gpus: FakeGpu::many("mix1", 1, "NVIDIA L4", 23034, 1),
        vendor: Some((
            Vendor::Ascend {
                chip: "Ascend910B4".into(),
            },
            ascend_910b4(2),
        )),
        ..Default::default()
    }
}

/// On [`mixed_node`], one GpuNode lists the agent's GPU and the plugin's
/// NPUs (each written by its own field manager); a pod of each family runs
/// with its own variables from its own plugin, and a pod asking for both
/// waits, saying why.
async fn mixed_node_serves_both_families(cluster: &LocalCluster, client: &Client) {
    let gpu_nodes = Api::<GpuNode>::all(client.clone());
    let listed = async || {
        let status = gpu_nodes.get_opt("mix-1").await.ok()??.status?;
        let families: Vec<&str> = status.devices.iter().map(|d| d.family.as_str()).collect();
        let vendor_ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "VendorPluginsReady" && c.status == "True");
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (families.iter().filter(|&&f| f == "nvidia").count() == 1
            && families.iter().filter(|&&f| f == "ascend").count() == 2
            && status.gpu_count == 1
            && vendor_ready
            && ready)
            .then_some(())
    };
    wait_for("mix-1's GpuNode with both families", LIMIT, listed).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nv: Pod = serde_json::from_value(gpu_pod(
        "mix-nv",
        4096,
        Some(30),
        "env | sort; echo END; sleep 3600",
    ))
    .unwrap();
    let npu = vendor_pod(
        "mix-npu",
        json!({"huawei.com/Ascend910B4": 1, "huawei.com/Ascend910B4-memory": 3000}),
    );
    let both = vendor_pod(
        "mix-both",
        json!({"nvidia.com/gpu": 1, "huawei.com/Ascend910B4": 1}),
    );
    for pod in [nv, npu, both] {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let out = logs_when_done(cluster, "mix-nv").await;
    assert!(out.contains("CUDA_DEVICE_MEMORY_LIMIT_0=4096m"), "{out}");
    assert!(!out.contains("ASCEND_VISIBLE_DEVICES"), "{out}");
    let out = logs_when_done(cluster, "mix-npu").await;
    assert!(out.contains("ASCEND_VNPU_SPECS=vir05_1c_8g"), "{out}");
    assert!(!out.contains("CUDA_DEVICE_MEMORY_LIMIT"), "{out}");
    for (name, family) in [("mix-nv", "nvidia"), ("mix-npu", "ascend")] {
        let served = allocated(client, name).await;
        assert_eq!(served.spec.node_name, "mix-1");
        assert_eq!(served.spec.totals.families, family);
    }
    let reason = wait_for("mix-both to wait", LIMIT, async || {
        scheduling_failure(client, "default", "mix-both").await
    })
    .await;
    assert!(
        reason.contains("asks for NVIDIA GPUs and ascend devices"),
        "{reason}"
    );
    // Both plugins' pods served, the GpuNode still lists both families.
    wait_for("mix-1's GpuNode still with both families", LIMIT, listed).await;
}

/// A node of `vendor`'s `devices`, served by the mock plugin.
fn vendor_node(name: &str, vendor: Vendor, devices: Vec<MockDevice>) -> NodeGpus {
    NodeGpus {
        name: name.into(),
        vendor: Some((vendor, devices)),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn every_mocked_vendor_s_pods_run_beside_nvidia_through_its_plugin() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let nodes = [
        nvidia_node(),
        vendor_node(
            "npu-1",
            Vendor::Ascend {
                chip: "Ascend910B4".into(),
            },
            ascend_910b4(2),
        ),
        vendor_node("dcu-1", Vendor::Hygon, hygon_dcus(2)),
        vendor_node(
            "amd-1",
            Vendor::Amd {
                product: "AMD Instinct MI300X VF".into(),
            },
            amd_mi300x(1),
        ),
        vendor_node(
            "ix-1",
            Vendor::Iluvatar {
                chip: "MR-V100".into(),
            },
            iluvatar_mr_v100(1),
        ),
        vendor_node("xpu-1", Vendor::Kunlunxin, kunlunxin_xpus(1)),
        vendor_node("mx-1", Vendor::Metax, metax_c500(1)),
    ];
    let cluster =
        LocalCluster::start_with(None, Lifetime::Tied, &nodes, &artifacts, chart_values())
            .await
            .unwrap();
    let client = cluster.plane.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // The vendor nodes' GpuNodes, from the plugins' annotations.
    for (node, family, count) in [
        ("npu-1", "ascend", 2),
        ("dcu-1", "hygon", 2),
        ("amd-1", "amd", 1),
        ("ix-1", "iluvatar", 1),
        ("xpu-1", "kunlunxin", 1),
        ("mx-1", "metax", 1),
    ] {
        vendor_gpu_node(&client, node, family, count).await;
    }

    let create = |pod: Pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
    };
    create(
        serde_json::from_value(gpu_pod(
            "nv",
            4096,
            Some(30),
            "env | sort; echo END; sleep 3600",
        ))
        .unwrap(),
    )
    .await;
    create(vendor_pod(
        "npu",
        json!({"huawei.com/Ascend910B4": 1, "huawei.com/Ascend910B4-memory": 3000}),
    ))
    .await;
    create(vendor_pod(
        "dcu",
        json!({"hygon.com/dcunum": 1, "hygon.com/dcumem": 4096, "hygon.com/dcucores": 30}),
    ))
    .await;

    // Iluvatar counts memory in 256 MiB units (16: 4096 MiB); Kunlunxin
    // rounds a vXPU's memory up to 24576, 49152 or 98304 MiB.
    create(vendor_pod(
        "ix",
        json!({"iluvatar.ai/MR-V100-vgpu": 1, "iluvatar.ai/MR-V100.vMem": 16, "iluvatar.ai/MR-V100.vCore": 50}),
    ))
    .await;
    create(vendor_pod(
        "xpu",
        json!({"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 20000}),
    ))
    .await;
    // MetaX counts sGPU memory in GiB.
    create(vendor_pod(
        "sgpu",
        json!({"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 4, "metax-tech.com/vcore": 60}),
    ))
    .await;

    // Two AMD pods of a quarter of the GPU's compute each: Tessera counts
    // 76 of its 304 compute units per pod, the plugin picks which, and the
    // two never overlap.
    for name in ["amd-a", "amd-b"] {
        create(vendor_pod(
            name,
            json!({"amd.com/gpu": 1, "amd.com/gpumem": 8192, "amd.com/gpucores": 25}),
        ))
        .await;
        let out = logs_when_done(&cluster, name).await;
        assert!(out.contains("ROCR_VISIBLE_DEVICES=AMD-MI300X-0"), "{out}");
        assert!(out.contains("HIP_DEVICE_MEMORY_LIMIT=8192m"), "{out}");
        let mask = if name == "amd-a" {
            "0:0-75"
        } else {
            "0:76-151"
        };
        assert!(
            out.contains(&format!("HSA_CU_MASK={mask}")),
            "{name}: {out}"
        );
        let served = allocated(&client, name).await;
        assert_eq!(served.spec.containers[0].devices[0].cores, 76);
    }

    let nv = logs_when_done(&cluster, "nv").await;
    assert!(nv.contains("CUDA_DEVICE_MEMORY_LIMIT_0=4096m"), "{nv}");
    let npu = logs_when_done(&cluster, "npu").await;
    assert!(
        npu.contains("ASCEND_VISIBLE_DEVICES=0") || npu.contains("ASCEND_VISIBLE_DEVICES=1"),
        "{npu}"
    );
    assert!(npu.contains("ASCEND_VNPU_SPECS=vir05_1c_8g"), "{npu}");
    let dcu = logs_when_done(&cluster, "dcu").await;
    assert!(dcu.contains("HIP_VISIBLE_DEVICES="), "{dcu}");
    assert!(
        dcu.contains(":4096:30"),
        "the DCU's vdev says 4096 MiB and 30 cores: {dcu}"
    );

    let ix = logs_when_done(&cluster, "ix").await;
    assert!(
        ix.contains("TESSERA_MOCK_IX_VDEV=MR-V100-0:4096:50"),
        "{ix}"
    );
    let xpu = logs_when_done(&cluster, "xpu").await;
    assert!(xpu.contains("XPU_VISIBLE_DEVICES=0"), "{xpu}");
    assert!(xpu.contains("TESSERA_MOCK_XPU_VDEV=XPU-0:24576"), "{xpu}");
    let sgpu = logs_when_done(&cluster, "sgpu").await;
    assert!(
        sgpu.contains("TESSERA_MOCK_SGPU=MX-C500-0:4096:60"),
        "MetaX's own list says 4096 MiB and 60 %: {sgpu}"
    );

    // One ledger: every family's holder, Allocated once served.
    for (name, family) in [
        ("nv", "nvidia"),
        ("npu", "ascend"),
        ("dcu", "hygon"),
        ("ix", "iluvatar"),
        ("xpu", "kunlunxin"),
        ("sgpu", "metax"),
    ] {
        let served = allocated(&client, name).await;
        assert_eq!(served.spec.totals.families, family);
    }
    let table = cluster
        .plane
        .kubectl()
        .unwrap()
        .args(["get", "vgpuallocations", "-n", "default"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("FAMILY"), "{table}");
    for line in [
        "nvidia",
        "ascend",
        "hygon",
        "iluvatar",
        "kunlunxin",
        "metax",
    ] {
        assert!(table.contains(line), "{table}");
    }
    let npu_pod = pods.get("npu").await.unwrap();
    let annotations = npu_pod.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations["hami.io/bind-phase"], "success");
    assert_eq!(
        annotations["hami.io/Ascend910B4-devices-to-allocate"], ";",
        "the plugin erased what it served"
    );

    // Two whole cards do not fit beside the vNPU: the vendor's words.
    create(vendor_pod(
        "two-cards",
        json!({"huawei.com/Ascend910B4": 2}),
    ))
    .await;
    let reason = wait_for("two-cards to be refused", LIMIT, async || {
        scheduling_failure(&client, "default", "two-cards").await
    })
    .await;
    assert!(
        reason.contains(
            "needs 2 Ascend910B4 NPUs with 32768 MiB and 0 cores each; 1 of 2 Ascend910B4 NPUs fit"
        ),
        "{reason}"
    );
    // The vNPU goes: its slices are released and the two cards run.
    pods.delete("npu", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_for("two-cards to run", LIMIT, async || {
        let pod = pods.get("two-cards").await.ok()?;
        (phase(&pod) == "Running").then_some(())
    })
    .await;
    let two = logs_when_done(&cluster, "two-cards").await;
    assert!(two.contains("ASCEND_VISIBLE_DEVICES=0,1"), "{two}");

    // A malformed register annotation: reported on the Node, no device
    // guessed; the plugin's next register pass repairs it.
    Api::<Node>::all(client.clone())
        .patch(
            "dcu-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"hami.io/node-dcu-register": "not,a:device"}}}),
            ),
        )
        .await
        .unwrap();
    let warning = wait_for("a MalformedRegisterAnnotation event", LIMIT, async || {
        let events = Api::<Event>::namespaced(client.clone(), "default")
            .list(&ListParams::default().fields("involvedObject.name=dcu-1"))
            .await
            .ok()?;
        events
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("MalformedRegisterAnnotation"))
    })
    .await;
    assert!(
        warning
            .message
            .unwrap_or_default()
            .contains("hami.io/node-dcu-register device 0 has 2 comma-separated fields"),
    );
    wait_for("dcu-1's DCUs back", LIMIT, async || {
        let g = Api::<GpuNode>::all(client.clone())
            .get_opt("dcu-1")
            .await
            .ok()??;
        (g.status?.gpu_count == 2).then_some(())
    })
    .await;
}

/// Annotations of pod `name`.
async fn pod_annotations(
    pods: &Api<Pod>,
    name: &str,
) -> std::collections::BTreeMap<String, String> {
    pods.get(name)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn vendors_reporting_only_capacity_are_served_through_their_plugins_protocols() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let nodes = [
        mixed_node(),
        vendor_node("mlu-1", Vendor::Cambricon, cambricon_mlu370(2)),
        vendor_node("gcu-1", Vendor::EnflameDrs, enflame_s60(2)),
        vendor_node("gcu-2", Vendor::EnflameGcu, enflame_gcus(1)),
        vendor_node("mxg-1", Vendor::MetaxGpu, metax_gpus(1)),
        vendor_node("xpu-2", Vendor::KunlunxinXpu, kunlunxin_whole_xpus(4)),
        vendor_node("mt-1", Vendor::Mthreads, mthreads_s4000(1)),
        vendor_node(
            "inf-1",
            Vendor::Neuron {
                instance_type: "inf2.xlarge".into(),
            },
            neuron_devices(2),
        ),
    ];
    let cluster =
        LocalCluster::start_with(None, Lifetime::Tied, &nodes, &artifacts, chart_values())
            .await
            .unwrap();
    let client = cluster.plane.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let create = |pod: Pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
    };

    mixed_node_serves_both_families(&cluster, &client).await;

    // Cambricon: 2 MLUs of 16 GiB from the Node's capacity (200 vcore, 128
    // vmemory of 256 MiB).
    let memory = vendor_gpu_node(&client, "mlu-1", "cambricon", 2).await;
    assert_eq!(memory, 16384);
    // Each pod's smlu is made by the plugin's two Allocate calls; the
    // second marks the pod assigned and drops Cambricon's Node lock.
    let mut slots = Vec::new();
    for (name, vmemory, vcore) in [("mlu-a", 16, 30), ("mlu-b", 40, 80)] {
        create(vendor_pod(
            name,
            json!({"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": vmemory,
                "cambricon.com/mlu.smlu.vcore": vcore}),
        ))
        .await;
        let out = logs_when_done(&cluster, name).await;
        let dsmlu = out
            .lines()
            .find_map(|l| l.strip_prefix("TESSERA_MOCK_DSMLU="))
            .unwrap_or_else(|| panic!("{name}: {out}"));
        assert_eq!(
            dsmlu.split_once(':').unwrap().1,
            format!("{}:{vcore}", vmemory * 256),
            "{name}: {out}"
        );
        let slot = dsmlu.split(':').next().unwrap().to_owned();
        assert!(
            out.contains(&format!(
                "VIRTUAL_DEVICES=/dev/cambricon_dev{slot},/dev/cambricon_ipcm{slot},"
            )),
            "{out}"
        );
        slots.push(slot);
        let a = pod_annotations(&pods, name).await;
        assert_eq!(a["CAMBRICON_DSMLU_ASSIGHED"], "true", "{a:?}");
        assert!(a.contains_key("CAMBRICON_DSMLU_PROFILE_INSTANCE"), "{a:?}");
        allocated(&client, name).await;
        wait_for("Cambricon's Node lock released", LIMIT, async || {
            let node = Api::<Node>::all(client.clone()).get("mlu-1").await.ok()?;
            (!node
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key("cambricon.com/dsmlu.lock"))
            .then_some(())
        })
        .await;
    }
    assert_ne!(slots[0], slots[1], "80 cores do not fit beside 30");
    // 80 cores fit on neither MLU now; once mlu-a goes they do, and the
    // plugin's count of the MLU's instances agrees.
    create(vendor_pod(
        "mlu-c",
        json!({"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 8,
            "cambricon.com/mlu.smlu.vcore": 80}),
    ))
    .await;
    let reason = wait_for("mlu-c to wait", LIMIT, async || {
        scheduling_failure(&client, "default", "mlu-c").await
    })
    .await;
    assert!(reason.contains("MLU"), "{reason}");
    pods.delete("mlu-a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let out = logs_when_done(&cluster, "mlu-c").await;
    assert!(
        out.contains(&format!("TESSERA_MOCK_DSMLU={}:2048:80", slots[0])),
        "{out}"
    );

    // Enflame DRS: 2 GCUs of 6 slices from `enflame.com/gcu-drs-capacity`.
    // gcushare serves a container whose `drs-gcu` limit matches, makes
    // the profile's instance on the GCU Tessera chose, and marks it.
    vendor_gpu_node(&client, "gcu-1", "enflame", 2).await;
    let mut minors = Vec::new();
    for (name, slices, profile) in [("drs-a", 3, "3g.24gb"), ("drs-b", 6, "6g.48gb")] {
        create(vendor_pod(name, json!({"enflame.com/drs-gcu": slices}))).await;
        let out = logs_when_done(&cluster, name).await;
        let minor = out
            .lines()
            .find_map(|l| l.strip_prefix("ENFLAME_VISIBLE_DEVICES="))
            .unwrap_or_else(|| panic!("{name}: {out}"))
            .to_owned();
        assert!(
            out.contains(&format!("TOPS_VISIBLE_DEVICES=DRS-gcu{minor}-{profile}-")),
            "{name}: {out}"
        );
        let a = pod_annotations(&pods, name).await;
        assert_eq!(a["enflame.com/gcu-assigned"], "true", "{a:?}");
        let records: Value = serde_json::from_str(&a["assigned-containers"]).unwrap();
        assert_eq!(records["cuda"]["allocated"], true, "{records}");
        assert_eq!(records["cuda"]["profileName"], profile, "{records}");
        allocated(&client, name).await;
        minors.push(minor);
    }
    assert_ne!(
        minors[0], minors[1],
        "a whole GCU's profile needs an empty GCU"
    );
    create(vendor_pod("drs-c", json!({"enflame.com/drs-gcu": 6}))).await;
    let reason = wait_for("drs-c to wait", LIMIT, async || {
        scheduling_failure(&client, "default", "drs-c").await
    })
    .await;
    assert!(
        reason.contains("Enflame") || reason.contains("DRS"),
        "{reason}"
    );

    // The plugins whose source is closed, as HAMi's annotations tell them
    // what to serve: whole GCUs, whole MetaX GPUs and whole Kunlunxin XPUs
    // (HAMi's list or `BAIDU_COM_DEVICE_IDX`, then `bind-phase: success`),
    // Moore Threads (`mthreads.com/gpu-index`) and AWS Neuron
    // (`AWS_NEURON_IDS`, then `NEURON_ALLOCATED: "true"`).
    for (node, family, count) in [
        ("gcu-2", "enflame", 1),
        ("mxg-1", "metax", 1),
        ("xpu-2", "kunlunxin", 4),
        ("mt-1", "mthreads", 1),
        ("inf-1", "awsneuron", 2),
    ] {
        vendor_gpu_node(&client, node, family, count).await;
    }
    for (name, limits, wanted) in [
        (
            "gcu",
            json!({"enflame.com/gcu": 1}),
            "ENFLAME_VISIBLE_DEVICES=0",
        ),
        (
            "mxg",
            json!({"metax-tech.com/gpu": 1}),
            "TESSERA_MOCK_METAX_GPUS=0",
        ),
        (
            "mt",
            json!({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 4}),
            "MTHREADS_VISIBLE_DEVICES=0",
        ),
        (
            "core",
            json!({"aws.amazon.com/neuroncore": 1}),
            "NEURON_RT_VISIBLE_CORES=",
        ),
    ] {
        create(vendor_pod(name, limits)).await;
        let out = logs_when_done(&cluster, name).await;
        assert!(out.contains(wanted), "{name}: {out}");
    }
    // Two XPUs of one wing; a whole Neuron device beside the core.
    create(vendor_pod("xpus", json!({"kunlunxin.com/xpu": 2}))).await;
    let out = logs_when_done(&cluster, "xpus").await;
    assert!(
        out.contains("XPU_VISIBLE_DEVICES=0,1") || out.contains("XPU_VISIBLE_DEVICES=2,3"),
        "{out}"
    );
    let core = pod_annotations(&pods, "core").await;
    assert_eq!(core["NEURON_ALLOCATED"], "true", "{core:?}");
    let core_device = core["AWS_NEURON_IDS"].parse::<u32>().unwrap() / 2;
    create(vendor_pod("device", json!({"aws.amazon.com/neuron": 1}))).await;
    let out = logs_when_done(&cluster, "device").await;
    assert!(
        out.contains(&format!("AWS_NEURON_VISIBLE_DEVICES={}", 1 - core_device)),
        "the device whose core is free: {out}"
    );
    for name in ["gcu", "mxg", "xpus"] {
        assert_eq!(
            pod_annotations(&pods, name).await["hami.io/bind-phase"],
            "success"
        );
    }
    for (name, family) in [
        ("gcu", "enflame"),
        ("mxg", "metax"),
        ("xpus", "kunlunxin"),
        ("mt", "mthreads"),
        ("core", "awsneuron"),
        ("device", "awsneuron"),
    ] {
        let served = allocated(&client, name).await;
        assert_eq!(served.spec.totals.families, family);
    }
}

/// The container's variable `key` in pod `name`'s printed environment.
async fn printed(cluster: &LocalCluster, name: &str, key: &str) -> String {
    let out = logs_when_done(cluster, name).await;
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{name} printed no {key}: {out}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn vastai_dies_and_biren_gpus_are_served_as_hamis_plugins_read_them() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let nodes = [
        nvidia_node(),
        vendor_node("va-1", Vendor::Vastai, vastai_dies(2, 2)),
        vendor_node("br-1", Vendor::Biren, biren_gpus(2)),
    ];
    let cluster =
        LocalCluster::start_with(None, Lifetime::Tied, &nodes, &artifacts, chart_values())
            .await
            .unwrap();
    let client = cluster.plane.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    vendor_gpu_node(&client, "va-1", "vastai", 4).await;
    vendor_gpu_node(&client, "br-1", "biren", 2).await;
    let create = |pod: Pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
    };

    // Vastai dies: VA-0 and VA-1 sit on card 0, VA-2 and VA-3 on card 1.
    // A die taken on card 0 keeps a mutex pod off the card's other die.
    create(vendor_pod("va-one", json!({"vastaitech.com/va": 1}))).await;
    let first = printed(&cluster, "va-one", "TESSERA_MOCK_VA_DEVICES").await;
    let card = |die: &str| {
        die.strip_prefix("VA-")
            .and_then(|i| i.parse::<u32>().ok())
            .map(|i| i / 2)
    };
    let mut mutex = vendor_pod("va-mutex", json!({"vastaitech.com/va": 1}));
    mutex.metadata.annotations = Some(
        [(
            "hami.io/gpu-scheduler-policy".to_owned(),
            "mutex".to_owned(),
        )]
        .into(),
    );
    create(mutex).await;
    let alone = printed(&cluster, "va-mutex", "TESSERA_MOCK_VA_DEVICES").await;
    assert_ne!(
        card(&first),
        card(&alone),
        "mutex takes a die of an idle card: {first} then {alone}"
    );
    // The one die left on each card: two dies now span both cards.
    create(vendor_pod("va-two", json!({"vastaitech.com/va": 2}))).await;
    let two = printed(&cluster, "va-two", "TESSERA_MOCK_VA_DEVICES").await;
    assert_eq!(two.split(',').count(), 2, "{two}");

    // Biren: two whole GPUs to one pod, by id in BR_PHY_CARDS; a third
    // waits with the vendor's words until they are released.
    create(vendor_pod("br", json!({"birentech.com/gpu": 2}))).await;
    let cards = printed(&cluster, "br", "BR_PHY_CARDS").await;
    let mut listed: Vec<&str> = cards.split(',').collect();
    listed.sort_unstable();
    assert_eq!(listed, ["BR-0", "BR-1"]);
    let annotations = pod_annotations(&pods, "br").await;
    assert_eq!(annotations["hami.io/bind-phase"], "success");
    assert_eq!(
        annotations["hami.io/Biren-devices-allocated"], ";",
        "the plugin erased what it served"
    );
    create(vendor_pod("br-more", json!({"birentech.com/gpu": 1}))).await;
    let reason = wait_for("br-more to be refused", LIMIT, async || {
        scheduling_failure(&client, "default", "br-more").await
    })
    .await;
    assert!(
        reason.contains("needs 1 Biren GPU; 0 of 2 Biren GPUs fit"),
        "{reason}"
    );

    // One ledger: both families' holders, Allocated once served.
    for (name, family) in [
        ("va-one", "vastai"),
        ("va-mutex", "vastai"),
        ("br", "biren"),
    ] {
        let served = allocated(&client, name).await;
        assert_eq!(served.spec.totals.families, family);
    }
    pods.delete("br", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let again = printed(&cluster, "br-more", "BR_PHY_CARDS").await;
    assert!(again == "BR-0" || again == "BR-1", "{again}");
}
