//! End to end on a real control plane: kube-apiserver, etcd, the real
//! kube-scheduler calling Tessera's extender, the webhook and lifecycle
//! controllers, node agents with the fake GPU backend, and kubelet
//! simulators that speak the real device-plugin protocol to them.

use tessera_testkit::cluster as support;

use std::{path::PathBuf, time::Duration};

use kube::{Api, api::PostParams};
use serde_json::json;
use support::Cluster;
use tessera_api::v1alpha1::{AllocationPhase, GpuNode, GpuNodeConfig, NodeLock};
use tessera_controllers::config::Config;
use tessera_e2e::kubelet::Served;

mod common;

use common::{GpuHost, WAIT, allocation, eventually, wait_published};

#[tokio::test]
async fn pods_get_their_slice_through_the_real_device_plugin_protocol() {
    let cluster = Cluster::start(Config::default()).await;
    let mut host = GpuHost::start(&cluster, "agent-1", 2).await;
    wait_published(&cluster, &host, 2).await;
    host.kubelet
        .wait_for("registration and 20 replica devices", WAIT, |s| {
            s.registrations == 1 && s.devices.len() == 20
        })
        .await
        .unwrap();
    // Registered: the readiness probe's endpoint says so.
    let readyz = async || {
        tessera_e2e::http::get(&format!("127.0.0.1:{}", host.metrics_port), "/readyz")
            .await
            .map(|r| r.status)
            .unwrap_or(0)
    };
    eventually("/readyz to answer 200", async || readyz().await == 200).await;
    let gpu_node = Api::<GpuNode>::all(cluster.client.clone())
        .get("agent-1")
        .await
        .unwrap();
    let owner = gpu_node.metadata.owner_references.unwrap_or_default();
    assert_eq!(owner.first().map(|o| o.kind.as_str()), Some("Node"));

    // One pod: 3000 MiB and 30 % of a GPU.
    cluster
        .create_pod(
            "sliced",
            json!({"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
            json!({}),
        )
        .await;
    let served = host.served("sliced").await;
    let served_at = tokio::time::Instant::now();
    assert_eq!(served.len(), 1);
    let allocated = allocation(&cluster.client, "sliced").await;
    let uuid = &allocated.spec.containers[0].devices[0].uuid;
    let env = &served[0].envs;
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], *uuid);
    assert_eq!(env["CUDA_DEVICE_MEMORY_LIMIT_0"], "3000m");
    assert_eq!(env["CUDA_DEVICE_SM_LIMIT"], "30");
    assert!(
        served[0].device_ids[0].starts_with(uuid.as_str()),
        "GetPreferredAllocation steered the kubelet to {uuid}: {:?}",
        served[0].device_ids
    );
    assert!(
        served[0]
            .mounts
            .iter()
            .any(|(c, h, ro)| c == "/usr/local/vgpu/libtessera_vgpu.so"
                && h == "/opt/tessera/libtessera_vgpu.so"
                && *ro)
    );
    let region = served[0]
        .mounts
        .iter()
        .find(|(c, _, _)| c == "/var/run/tessera/vgpu")
        .unwrap();
    assert!(
        PathBuf::from(&region.1).is_dir(),
        "the region directory exists on the host"
    );
    eventually(
        "allocation Allocated, which releases the lock",
        async || {
            let a = allocation(&cluster.client, "sliced").await;
            let lock = Api::<NodeLock>::all(cluster.client.clone())
                .get_opt("agent-1")
                .await
                .unwrap();
            let allocated =
                a.status.as_ref().and_then(|s| s.phase) == Some(AllocationPhase::Allocated);
            allocated && lock.is_some_and(|l| !l.held_among(&[a]))
        },
    )
    .await;
    assert!(
        served_at.elapsed() < Duration::from_secs(1),
        "lock released within a second of Allocate: {:?}",
        served_at.elapsed()
    );
    // The monitor shows the container's limits before its first CUDA call.
    let metrics = host.metrics().await;
    let limit = format!(
        r#"hami_vgpu_memory_limit_bytes{{container="main",device_uuid="{uuid}",namespace="default",pod="sliced",vdevice_index="0",zone="vGPU"}} {}"#,
        3000u64 << 20
    );
    assert!(
        metrics.lines().any(|l| l == limit),
        "{limit} not in\n{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            r#"tessera_gpu_cores_allocated_percent{{node="agent-1",uuid="{uuid}""#
        )),
        "{metrics}"
    );

    // A pod with a GPU init container and a GPU app container: two Allocate
    // calls, init first, each with its own slice.
    cluster
        .create_raw_pod(json!({
            "metadata": {"name": "two-step"},
            "spec": {
                "schedulerName": "tessera-scheduler",
                "initContainers": [{"name": "warmup", "image": "example.invalid/cuda",
                    "resources": {"limits": {"nvidia.com/gpumem": "1500"}}}],
                "containers": [{"name": "main", "image": "example.invalid/cuda",
                    "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2500"}}}],
            },
        }))
        .await
        .unwrap();
    let state = host
        .kubelet
        .wait_for("both containers of two-step", WAIT, |s| {
            s.served.iter().filter(|c| c.pod == "two-step").count() == 2
        })
        .await
        .unwrap();
    let steps: Vec<&Served> = state
        .served
        .iter()
        .filter(|c| c.pod == "two-step")
        .collect();
    assert_eq!(steps[0].container, "warmup");
    assert_eq!(steps[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1500m");
    assert_eq!(steps[1].container, "main");
    assert_eq!(steps[1].envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "2500m");
    let allocated = allocation(&cluster.client, "two-step").await;
    let main_uuids: Vec<&str> = allocated.spec.containers[1]
        .devices
        .iter()
        .map(|d| d.uuid.as_str())
        .collect();
    assert_eq!(
        steps[1].envs["NVIDIA_VISIBLE_DEVICES"],
        main_uuids.join(",")
    );

    // Two pods bound to the node at once are both served with their own slices.
    for (name, mib) in [("pair-a", "1111"), ("pair-b", "2222")] {
        cluster
            .create_pod(name, json!({"nvidia.com/gpumem": mib}), json!({}))
            .await;
    }
    for (name, mib) in [("pair-a", "1111m"), ("pair-b", "2222m")] {
        let served = host.served(name).await;
        let allocated = allocation(&cluster.client, name).await;
        assert_eq!(served[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"], mib, "{name}");
        assert_eq!(
            served[0].envs["NVIDIA_VISIBLE_DEVICES"], allocated.spec.containers[0].devices[0].uuid,
            "{name}"
        );
    }

    // Kubelet restart: every socket goes, the agent registers again.
    host.kubelet.restart().unwrap();
    host.kubelet
        .wait_for("re-registration after a kubelet restart", WAIT, |s| {
            s.registrations == 2 && s.devices.len() == 20
        })
        .await
        .unwrap();
    cluster
        .create_pod(
            "after-kubelet",
            json!({"nvidia.com/gpumem": "1000"}),
            json!({}),
        )
        .await;
    assert_eq!(host.served("after-kubelet").await.len(), 1);

    // Agent restart: nothing is lost (the GpuNode and every allocation stay
    // as they were); the new agent registers again and serves the next pod.
    host.stop_agent();
    let before = Api::<GpuNode>::all(cluster.client.clone())
        .get("agent-1")
        .await
        .unwrap();
    // The stopped agent closed its node: it holds the node's lock.
    let locks = Api::<NodeLock>::all(cluster.client.clone());
    let closed = locks.get("agent-1").await.unwrap();
    assert!(closed.spec.draining, "{closed:?}");
    assert_eq!(closed.spec.holder.name, "tessera-agent-agent-1");
    host.start_agent(cluster.plane.kubeconfig());
    host.kubelet
        .wait_for("re-registration after an agent restart", WAIT, |s| {
            s.registrations == 3
        })
        .await
        .unwrap();
    cluster
        .create_pod(
            "after-agent",
            json!({"nvidia.com/gpumem": "1000"}),
            json!({}),
        )
        .await;
    let served = host.served("after-agent").await;
    assert_eq!(served[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m");
    let after = Api::<GpuNode>::all(cluster.client.clone())
        .get("agent-1")
        .await
        .unwrap();
    // A stopping agent marks its node not Ready (no pod is sent to it while
    // it is away); the restarted one finds the GpuNode as it left it
    // otherwise, and Ready again once registered.
    let ready = |node: &GpuNode| {
        let condition = node
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .cloned()
            .unwrap();
        (condition.status, condition.reason)
    };
    assert_eq!(
        ready(&before),
        ("False".to_owned(), "AgentStopping".to_owned())
    );
    assert_eq!(
        ready(&after),
        ("True".to_owned(), "AllGpusHealthy".to_owned())
    );
    let without_conditions = |node: GpuNode| {
        let mut status = node.status.unwrap();
        status.conditions.clear();
        status
    };
    assert_eq!(
        without_conditions(before),
        without_conditions(after),
        "the restarted agent found its GpuNode as it left it"
    );
    for pod in [
        "sliced",
        "two-step",
        "pair-a",
        "pair-b",
        "after-kubelet",
        "after-agent",
    ] {
        let phase = allocation(&cluster.client, pod)
            .await
            .status
            .and_then(|s| s.phase);
        assert_eq!(phase, Some(AllocationPhase::Allocated), "{pod}");
    }
}

#[tokio::test]
async fn config_and_health_changes_reach_the_kubelet_without_a_restart() {
    let cluster = Cluster::start(Config::default()).await;
    let host = GpuHost::start(&cluster, "agent-2", 2).await;
    host.kubelet
        .wait_for("20 replica devices", WAIT, |s| s.devices.len() == 20)
        .await
        .unwrap();

    // A GpuNodeConfig selecting the node by label changes the split count.
    let config: GpuNodeConfig = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": "a100-pool"},
        "spec": {"nodeSelector": {"matchLabels": {"gpu-pool": "a100"}}, "deviceSplitCount": 4},
    }))
    .unwrap();
    Api::<GpuNodeConfig>::all(cluster.client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    host.kubelet
        .wait_for("split count 4 in ListAndWatch", WAIT, |s| {
            s.devices.len() == 8
        })
        .await
        .unwrap();
    eventually("GpuNode reports the applied config", async || {
        let node = Api::<GpuNode>::all(cluster.client.clone())
            .get_opt("agent-2")
            .await
            .unwrap();
        node.and_then(|n| n.status).is_some_and(|s| {
            s.applied_configs == ["a100-pool"] && s.devices.iter().all(|d| d.split_count == 4)
        })
    })
    .await;

    // A health flip removes a GPU's replicas from use and a recovery restores them.
    host.write_gpus(&[true, false]);
    let unhealthy = host
        .kubelet
        .wait_for("GPU 1 unhealthy", WAIT, |s| {
            s.devices
                .iter()
                .filter(|(id, h)| id.starts_with("GPU-agent-2-1") && *h == "Unhealthy")
                .count()
                == 4
        })
        .await
        .unwrap();
    assert!(
        unhealthy
            .devices
            .iter()
            .filter(|(id, _)| id.starts_with("GPU-agent-2-0"))
            .all(|(_, h)| h == "Healthy")
    );
    eventually("the scheduler sees GPU 1 unhealthy", async || {
        cluster
            .projection
            .read()
            .node("agent-2")
            .is_some_and(|n| n.devices.iter().filter(|d| d.healthy).count() == 1)
    })
    .await;
    host.write_gpus(&[true, true]);
    host.kubelet
        .wait_for("GPU 1 back", WAIT, |s| {
            s.devices.len() == 8 && s.devices.values().all(|h| h == "Healthy")
        })
        .await
        .unwrap();

    // Removing the config brings back the default split count.
    Api::<GpuNodeConfig>::all(cluster.client.clone())
        .delete("a100-pool", &Default::default())
        .await
        .unwrap();
    host.kubelet
        .wait_for("default split count again", WAIT, |s| s.devices.len() == 20)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cluster_without_dra_serves_its_gpus_through_the_device_plugin() {
    // An API server that does not serve resource.k8s.io/v1, as Kubernetes
    // before 1.34 (the docs claim 1.30): a failed claim list or a config
    // asking for DRA must never switch the node's GPUs off.
    let plane = tessera_e2e::ControlPlane::start_with(tessera_e2e::Options {
        apiserver_args: vec!["--runtime-config=resource.k8s.io/v1=false".into()],
        ..tessera_e2e::Options::default()
    })
    .await
    .unwrap();
    let client = plane.client().await.unwrap();
    assert!(
        client
            .list_api_group_resources("resource.k8s.io/v1")
            .await
            .is_err(),
        "the API server still serves DRA"
    );
    let config: GpuNodeConfig = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": "wants-dra"},
        "spec": {"nodeNames": ["old-1"], "frontDoor": "dra"},
    }))
    .unwrap();
    Api::<GpuNodeConfig>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    support::create_node(&client, "old-1", json!({})).await;
    let host = GpuHost::start_on(&client, plane.kubeconfig(), "old-1", 2).await;
    eventually("the GpuNode says: device plugin, Ready", async || {
        let Ok(Some(node)) = Api::<GpuNode>::all(client.clone()).get_opt("old-1").await else {
            return false;
        };
        let Some(status) = node.status else {
            return false;
        };
        status.gpu_count == 2
            && status.front_door == tessera_api::v1alpha1::FrontDoor::DevicePlugin
            && status.settings.front_door == tessera_api::v1alpha1::FrontDoor::DevicePlugin
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await;
    host.kubelet
        .wait_for("the kubelet to see the GPUs' shares", WAIT, |s| {
            !s.devices.is_empty()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", host.agent_log()));
    let log = std::fs::read_to_string(host.dir.path().join("agent.log")).unwrap();
    assert!(
        log.contains("the cluster does not serve DRA"),
        "the agent says why: {}",
        host.agent_log()
    );
}

/// HAMi's per-GPU cordon (the Node's `hami.io/device-cordon` and its
/// declarative form, a GpuNodeConfig's `cordonDevices`) and the `mutex`
/// GPU policy, through the agent, the real kube-scheduler and the kubelet's
/// device-plugin protocol; malformed scoring weights are refused at
/// admission with HAMi's message.
#[tokio::test]
async fn cordon_and_mutex_steer_pods_through_the_agent_and_the_scheduler() {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};

    let cluster = Cluster::start(Config::default()).await;
    let client = cluster.client.clone();
    let host = GpuHost::start(&cluster, "ctl-1", 2).await;
    wait_published(&cluster, &host, 2).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let annotate = async |value: serde_json::Value| {
        nodes
            .patch(
                "ctl-1",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"hami.io/device-cordon": value}}}),
                ),
            )
            .await
            .unwrap();
    };
    let cordoned_by = async || -> Vec<Option<String>> {
        Api::<GpuNode>::all(client.clone())
            .get("ctl-1")
            .await
            .unwrap()
            .status
            .map(|s| s.devices.into_iter().map(|d| d.cordoned_by).collect())
            .unwrap_or_default()
    };
    let scheduler_sees = async |wanted: [bool; 2]| {
        eventually("the scheduler sees the cordon", async || {
            cluster.projection.read().node("ctl-1").is_some_and(|n| {
                n.devices
                    .iter()
                    .map(|d| d.cordoned)
                    .eq(wanted.iter().copied())
            })
        })
        .await;
    };

    // The annotation cordons GPU 0, which spread would pick (a tie goes to
    // the lower index): the pod goes to GPU 1.
    annotate(json!("GPU-ctl-1-0, ")).await;
    scheduler_sees([true, false]).await;
    assert_eq!(
        cordoned_by().await,
        [Some("hami.io/device-cordon".to_owned()), None]
    );
    let small = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"});
    cluster.create_pod("first", small.clone(), json!({})).await;
    host.served("first").await;
    cluster.served("first").await;
    assert_eq!(
        allocation(&client, "first").await.spec.totals.devices,
        "GPU-ctl-1-1"
    );

    // A mutex pod finds GPU 0 cordoned and GPU 1 busy.
    let mutex = json!({"hami.io/gpu-scheduler-policy": "mutex"});
    cluster.create_pod("alone", small.clone(), mutex).await;
    let reasons = cluster.failed_scheduling("alone").await.join("\n");
    assert!(
        reasons.contains("0 of 2 GPUs fit: 1 GPU cordoned")
            && reasons.contains(
                "1 GPU in use, but mutex in hami.io/gpu-scheduler-policy takes idle GPUs only"
            ),
        "{reasons}"
    );
    // Lifting the cordon lets it take the idle GPU, which is then its alone.
    annotate(serde_json::Value::Null).await;
    host.served("alone").await;
    cluster.served("alone").await;
    let alone = allocation(&client, "alone").await;
    assert_eq!(alone.spec.totals.devices, "GPU-ctl-1-0");
    assert!(alone.spec.containers[0].devices[0].mutex);
    cluster
        .create_pod(
            "joiner",
            small.clone(),
            json!({"nvidia.com/use-gpuuuid": "GPU-ctl-1-0"}),
        )
        .await;
    let reasons = cluster.failed_scheduling("joiner").await.join("\n");
    assert!(
        reasons.contains("1 GPU held exclusively by another container"),
        "{reasons}"
    );

    // GitOps: a GpuNodeConfig cordons GPU 1 by index; the running pod keeps
    // its slice.
    let config: GpuNodeConfig = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": "repair"},
        "spec": {"nodeNames": ["ctl-1"], "cordonDevices": {"indexes": [1]}},
    }))
    .unwrap();
    Api::<GpuNodeConfig>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    scheduler_sees([false, true]).await;
    assert_eq!(
        cordoned_by().await,
        [None, Some("GpuNodeConfig/repair".to_owned())]
    );
    cluster.create_pod("late", small.clone(), json!({})).await;
    let reasons = cluster.failed_scheduling("late").await.join("\n");
    assert!(
        reasons.contains("1 GPU cordoned") && reasons.contains("1 GPU held exclusively"),
        "{reasons}"
    );
    let first = allocation(&client, "first").await;
    assert_eq!(
        first.status.and_then(|s| s.phase),
        Some(AllocationPhase::Allocated),
        "a cordon leaves running pods alone"
    );

    // Malformed weights never reach the scheduler.
    let refused = cluster
        .create_raw_pod(json!({
            "metadata": {"name": "weighted", "annotations": {"hami.io/device-scoring-weights": "slot=1,core=-1,memory=3"}},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/cuda", "resources": {"limits": small}}]},
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(
            "invalid hami.io/device-scoring-weights annotation \"slot=1,core=-1,memory=3\": \"core\" weight must not be negative"
        ),
        "{refused}"
    );
}
