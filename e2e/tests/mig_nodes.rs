//! Dynamic MIG on a real node (containerd + kubelet, the chart's agent) whose
//! two fake A100-80GB GPUs are in MIG mode and whose settings say
//! `operatingMode: mig`:
//!
//! 1. HAMi's `examples/nvidia/dynamic_mig_example.yaml` (2 GPUs, 8000 MiB,
//!    `nvidia.com/vgpu-mode: mig`; image and command aside) runs: each GPU
//!    gets a `1g.10gb` instance that exists on the fake GPU, the container
//!    sees the two MIG UUIDs and no interposer;
//! 2. a second pod (30000 MiB) gets a `3g.40gb` instance beside them, and
//!    no two instances on a GPU share a memory slice;
//! 3. a pod no GPU can host stays Pending with the reason naming MIG;
//! 4. deleting the pods destroys their instances: the GPUs return empty.
//!
//! Static MIG (`migStrategy: mixed`) on a node whose A100-40GB carries the
//! operator's two `3g.20gb` instances: the Node advertises
//! `nvidia.com/mig-3g.20gb: 2` and no `nvidia.com/gpu`; HAMi's
//! `examples/nvidia/mig_example.yaml` runs twice, each pod with its own
//! instance, recorded in the ledger from the kubelet's pod-resources API (a
//! VgpuAllocation owned by the pod, the GpuNode naming it the instance's
//! holder); a third waits for one. A GpuNodeConfig then switches the node
//! to `migStrategy: single`: the instances become whole `nvidia.com/gpu`
//! devices, booked in the ledger like any GPU.
//!
//! Needs what the real-node tests need; `TESSERA_SKIP_REAL_NODES=1` skips it.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use tessera_api::{
    mig,
    v1alpha1::{GpuNode, GpuNodeConfig, MigInstance, VgpuAllocation},
};
use tessera_e2e::testkit::{self, phase};
use tessera_e2e::{
    Lifetime,
    artifacts::Artifacts,
    cluster::{LocalCluster, NodeGpus},
    images,
    node::FakeGpu,
};

const WAIT: Duration = Duration::from_secs(120);
const NODE: &str = "mig-node";

async fn wait_for<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    testkit::wait_for(what, WAIT, check).await
}

/// HAMi's dynamic_mig_example.yaml, with the test image and a command that
/// prints what the container was given.
fn dynamic_mig_example(name: &str, gpus: u32, memory: u64) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {
                "nvidia.com/vgpu-mode": "mig",
                "hami.io/gpu-scheduler-policy": "binpack",
            },
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "ubuntu-container", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; echo LIMIT=$CUDA_DEVICE_MEMORY_LIMIT_0; cat /etc/ld.so.preload 2>/dev/null | sed 's/^/PRELOAD=/'; echo END; sleep 3600"],
                "resources": {"limits": {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": memory}},
            }],
        },
    }))
    .unwrap()
}

/// Waits until pod `name`'s static MIG `instance` is in the ledger: its
/// VgpuAllocation, owned by the pod, Allocated with the instance served to
/// the container, and the GpuNode naming it as the instance's holder.
async fn static_record(client: &Client, name: &str, instance: &str) {
    testkit::allocated(client, "default", name, WAIT).await;
    // The agent creates the record, then writes its status with the
    // instances; the lifecycle controller may mark a record of a running
    // pod Allocated in between (its fallback for a lost write-back), and
    // the agent's write then adds the instances.
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), "default");
    let allocation = wait_for(
        &format!("{name}'s record to name its MIG instance"),
        async || {
            let allocation = allocations.get(name).await.ok()?;
            let served = &allocation.status.as_ref()?.mig_instances;
            (!served.is_empty()).then_some(allocation)
        },
    )
    .await;
    let owner = &allocation.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Pod", name));
    let served = &allocation.status.as_ref().unwrap().mig_instances;
    assert_eq!(served.len(), 1, "{served:?}");
    assert_eq!(
        (served[0].container.as_str(), served[0].uuid.as_str()),
        ("ubuntu-container", instance)
    );
    let slice = &allocation.spec.containers[0].devices[0];
    assert_eq!(slice.mig.as_ref().unwrap().profile, "3g.20gb");
    assert_eq!(slice.memory_mib, 19968);
    let holder = format!("default/{name}");
    wait_for(
        &format!("the GpuNode to name {holder} the holder"),
        async || {
            instances(client)
                .await
                .into_iter()
                .flat_map(|(_, i)| i)
                .any(|i| i.uuid == instance && i.held_by.as_deref() == Some(holder.as_str()))
                .then_some(())
        },
    )
    .await;
}

fn logs(cluster: &LocalCluster, pod: &str) -> String {
    cluster.plane.logs("default", pod).unwrap()
}

/// The MIG instances on each GPU of the node, as its GpuNode lists them.
async fn instances(client: &Client) -> Vec<(String, Vec<MigInstance>)> {
    let node = Api::<GpuNode>::all(client.clone()).get(NODE).await.unwrap();
    node.status
        .map(|s| {
            s.devices
                .into_iter()
                .map(|d| (d.uuid, d.mig_instances))
                .collect()
        })
        .unwrap_or_default()
}

fn assert_no_overlap(gpus: &[(String, Vec<MigInstance>)]) {
    for (gpu, instances) in gpus {
        let mut taken = 0u8;
        for instance in instances {
            let span = mig::span(instance.placement).unwrap();
            assert_eq!(taken & span, 0, "{gpu}: {instances:?} overlap");
            taken |= span;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn dynamic_mig_pods_get_instances_that_never_overlap_and_go_with_the_pod() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let gpus = FakeGpu::many(NODE, 2, "NVIDIA A100-SXM4-80GB", 81920, 1);
    let nodes = [NodeGpus {
        name: NODE.into(),
        mig: gpus.iter().map(|g| g.uuid.clone()).collect(),
        gpus,
        ..Default::default()
    }];
    // The node pool's default mode is mig (a GpuNodeConfig could say it for
    // some nodes only): GPUs in MIG mode serve nothing in hami-core mode.
    let defaults = json!({"nodeDefaults": {"operatingMode": "mig"}});
    let cluster = LocalCluster::start_with(None, Lifetime::Tied, &nodes, &artifacts, defaults)
        .await
        .unwrap();
    let client = cluster.plane.client().await.unwrap();
    wait_for("the GpuNode to offer dynamic MIG", async || {
        let node = Api::<GpuNode>::all(client.clone()).get(NODE).await.ok()?;
        let devices = node.status?.devices;
        (devices.len() == 2 && devices.iter().all(|d| d.mig.is_some())).then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), "default");

    // 1. HAMi's dynamic MIG example.
    pods.create(
        &PostParams::default(),
        &dynamic_mig_example("gpu-pod", 2, 8000),
    )
    .await
    .unwrap();
    let out = wait_for("gpu-pod to print its devices", async || {
        let out = logs(&cluster, "gpu-pod");
        out.contains("END").then_some(out)
    })
    .await;
    let allocation = allocations.get("gpu-pod").await.unwrap();
    let slices = &allocation.spec.containers[0].devices;
    assert_eq!(slices.len(), 2);
    assert_ne!(slices[0].uuid, slices[1].uuid, "one instance per GPU");
    for slice in slices {
        let mig = slice.mig.as_ref().expect("a MIG slice");
        assert_eq!(mig.profile, "1g.10gb");
        assert_eq!(slice.memory_mib, 9728);
    }
    let served = wait_for("the served MIG instances", async || {
        let status = allocations.get("gpu-pod").await.ok()?.status?;
        (status.mig_instances.len() == 2).then_some(status.mig_instances)
    })
    .await;
    let visible: Vec<&str> = served.iter().map(|i| i.uuid.as_str()).collect();
    assert!(
        out.contains(&format!("VISIBLE={}", visible.join(","))),
        "{out}"
    );
    assert!(visible.iter().all(|u| u.starts_with("MIG-")));
    assert!(out.contains("LIMIT=\n"), "no interposer limit: {out}");
    assert!(!out.contains("PRELOAD="), "no interposer: {out}");
    // The instances exist on the (fake) GPUs, held by the pod.
    let on_gpus = wait_for("the GpuNode to list the instances", async || {
        let gpus = instances(&client).await;
        let listed: Vec<&MigInstance> = gpus.iter().flat_map(|(_, i)| i).collect();
        (listed.len() == 2
            && listed
                .iter()
                .all(|i| i.held_by.as_deref() == Some("default/gpu-pod")))
        .then_some(gpus)
    })
    .await;
    for served in &served {
        let (_, on_gpu) = on_gpus.iter().find(|(g, _)| *g == served.gpu).unwrap();
        assert!(on_gpu.iter().any(|i| i.uuid == served.uuid), "{on_gpus:?}");
    }

    // 2. A larger instance beside them; nothing overlaps.
    pods.create(
        &PostParams::default(),
        &dynamic_mig_example("big", 1, 30000),
    )
    .await
    .unwrap();
    wait_for("big to run", async || {
        (phase(&pods.get("big").await.ok()?) == "Running").then_some(())
    })
    .await;
    let big = allocations.get("big").await.unwrap();
    assert_eq!(
        big.spec.containers[0].devices[0]
            .mig
            .as_ref()
            .unwrap()
            .profile,
        "3g.40gb"
    );
    let gpus = wait_for("three instances", async || {
        let gpus = instances(&client).await;
        (gpus.iter().map(|(_, i)| i.len()).sum::<usize>() == 3).then_some(gpus)
    })
    .await;
    assert_no_overlap(&gpus);

    // 3. More than any free placement: Pending, and the reason says MIG.
    pods.create(
        &PostParams::default(),
        &dynamic_mig_example("huge", 2, 50000),
    )
    .await
    .unwrap();
    let reason = wait_for("huge's FailedScheduling event", async || {
        testkit::scheduling_failure(&client, "default", "huge").await
    })
    .await;
    assert!(
        reason.contains("in MIG mode without room") && reason.contains("7g.80gb"),
        "{reason}"
    );
    assert_eq!(phase(&pods.get("huge").await.unwrap()), "Pending");

    // 4. Deleting the pods destroys their instances.
    for name in ["gpu-pod", "big", "huge"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let gpus = instances(&client).await;
        if gpus.iter().all(|(_, i)| i.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "instances left after the pods went: {gpus:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// HAMi's examples/nvidia/mig_example.yaml, with the test image and a
/// command that prints what the container was given.
fn mig_example(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "ubuntu-container", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; cat /etc/ld.so.preload 2>/dev/null | sed 's/^/PRELOAD=/'; echo END; sleep 3600"],
                "resources": {"limits": {"nvidia.com/mig-3g.20gb": 1}},
            }],
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn static_mixed_mig_serves_hamis_mig_example_one_instance_per_pod() {
    tessera_e2e::remove_stale_dirs();
    let artifacts = Artifacts::locate().unwrap();
    let gpus = FakeGpu::many(NODE, 1, "NVIDIA A100-SXM4-40GB", 40960, 1);
    let uuid = gpus[0].uuid.clone();
    let nodes = [NodeGpus {
        name: NODE.into(),
        mig: vec![uuid.clone()],
        mig_geometry: [(uuid, vec!["3g.20gb".to_owned(), "3g.20gb".to_owned()])].into(),
        gpus,
        vendor: None,
    }];
    let defaults = json!({"nodeDefaults": {"operatingMode": "mig", "migStrategy": "mixed"}});
    let cluster = LocalCluster::start_with(None, Lifetime::Tied, &nodes, &artifacts, defaults)
        .await
        .unwrap();
    let client = cluster.plane.client().await.unwrap();
    let allocatable = wait_for("the Node to advertise nvidia.com/mig-3g.20gb", async || {
        let node = Api::<Node>::all(client.clone()).get(NODE).await.ok()?;
        let allocatable = node.status?.allocatable?;
        (allocatable.get("nvidia.com/mig-3g.20gb")?.0 == "2").then_some(allocatable)
    })
    .await;
    assert!(
        allocatable.get("nvidia.com/gpu").is_none_or(|q| q.0 == "0"),
        "a mixed GPU offers no slice: {allocatable:?}"
    );
    let on_gpu: Vec<String> = instances(&client)
        .await
        .into_iter()
        .flat_map(|(_, i)| i)
        .map(|i| i.uuid)
        .collect();
    assert_eq!(on_gpu.len(), 2);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut seen = Vec::new();
    for name in ["gpu-pod", "gpu-pod-2"] {
        pods.create(&PostParams::default(), &mig_example(name))
            .await
            .unwrap();
        let out = wait_for(&format!("{name} to print its devices"), async || {
            let out = logs(&cluster, name);
            out.contains("END").then_some(out)
        })
        .await;
        let visible = out
            .lines()
            .find_map(|l| l.strip_prefix("VISIBLE="))
            .unwrap()
            .to_owned();
        assert!(
            on_gpu.contains(&visible),
            "{visible} is not an instance: {out}"
        );
        assert!(!out.contains("PRELOAD="), "no interposer: {out}");
        seen.push(visible);
    }
    assert_ne!(seen[0], seen[1], "each pod has its own instance");
    // The ledger records each pod's instance (the kubelet's pod-resources
    // API says which), and the GpuNode names the holder.
    for (name, instance) in ["gpu-pod", "gpu-pod-2"].into_iter().zip(&seen) {
        static_record(&client, name, instance).await;
    }

    // Both instances are taken: the default scheduler keeps a third waiting.
    pods.create(&PostParams::default(), &mig_example("gpu-pod-3"))
        .await
        .unwrap();
    let reason = wait_for("gpu-pod-3's FailedScheduling event", async || {
        testkit::scheduling_failure(&client, "default", "gpu-pod-3").await
    })
    .await;
    assert!(reason.contains("nvidia.com/mig-3g.20gb"), "{reason}");
    // One pod goes: the third gets its instance.
    pods.delete("gpu-pod", &DeleteParams::default())
        .await
        .unwrap();
    let out = wait_for("gpu-pod-3 to run", async || {
        let out = logs(&cluster, "gpu-pod-3");
        out.contains("END").then_some(out)
    })
    .await;
    assert!(out.contains(&format!("VISIBLE={}", seen[0])), "{out}");
    static_record(&client, "gpu-pod-3", &seen[0]).await;
    wait_for("gpu-pod's record to be released or gone", async || {
        let record = Api::<VgpuAllocation>::namespaced(client.clone(), "default")
            .get_opt("gpu-pod")
            .await
            .ok()?;
        record.is_none_or(|r| !r.is_live()).then_some(())
    })
    .await;

    // A GpuNodeConfig switches the node to migStrategy single: each
    // instance is now a whole nvidia.com/gpu, booked through Tessera.
    for name in ["gpu-pod-2", "gpu-pod-3"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let config: GpuNodeConfig = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": "single"},
        "spec": {"nodeNames": [NODE], "migStrategy": "single"},
    }))
    .unwrap();
    Api::<GpuNodeConfig>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    wait_for(
        "the Node to offer the instances as nvidia.com/gpu",
        async || {
            let node = Api::<Node>::all(client.clone()).get(NODE).await.ok()?;
            let allocatable = node.status?.allocatable?;
            (allocatable.get("nvidia.com/gpu")?.0 == "2").then_some(())
        },
    )
    .await;
    let whole: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "whole-instance"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; echo LIMIT=$CUDA_DEVICE_MEMORY_LIMIT_0; echo END; sleep 3600"],
                "resources": {"limits": {"nvidia.com/gpu": 1}},
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &whole).await.unwrap();
    let out = wait_for("whole-instance to print its device", async || {
        let out = logs(&cluster, "whole-instance");
        out.contains("END").then_some(out)
    })
    .await;
    let visible = out
        .lines()
        .find_map(|l| l.strip_prefix("VISIBLE="))
        .unwrap();
    assert!(on_gpu.iter().any(|u| u == visible), "{out}");
    let allocation = Api::<VgpuAllocation>::namespaced(client.clone(), "default")
        .get("whole-instance")
        .await
        .unwrap();
    let slice = &allocation.spec.containers[0].devices[0];
    assert_eq!(slice.uuid, visible, "the ledger books the instance");
    assert_eq!(slice.memory_mib, 19968, "all of a 3g.20gb");
}
