//! The device-plugin gRPC contract over a real unix socket, with the
//! kubelet simulator as the registration peer and a real API server behind
//! the agent: options, registration, ListAndWatch, GetPreferredAllocation,
//! Allocate's refusal without a NodeLock, PreStartContainer.

use std::time::Duration;

use serde_json::json;
use tessera_deviceplugin::{
    connect_unix,
    v1beta1::{
        AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
        PreStartContainerRequest, PreferredAllocationRequest,
        device_plugin_client::DevicePluginClient,
    },
};
use tessera_e2e::kubelet::KubeletSim;
use tessera_node_agent::plugin::{self, Endpoint};

mod fake_service;

/// Runs the agent's device plugin for `node` over the fake GPUs in `gpus`
/// (YAML), serving in `plugins`; returns its socket and registration state.
async fn run_plugin(
    client: kube::Client,
    node: &str,
    dir: &std::path::Path,
    gpus: &std::path::Path,
    plugins: &std::path::Path,
) -> (
    std::path::PathBuf,
    tokio::sync::watch::Receiver<plugin::PluginState>,
) {
    let endpoint = Endpoint {
        dir: plugins.to_owned(),
        resource: "nvidia.com/gpu".into(),
    };
    let socket = plugins.join(endpoint.socket_name());
    let (state, states) = tokio::sync::watch::channel(plugin::PluginState::NotRegistered);
    tokio::spawn(plugin::run(
        endpoint,
        fake_service::service(client, node, dir, gpus, dir).await,
        state,
    ));
    (socket, states)
}

#[tokio::test]
async fn the_plugin_speaks_the_kubelets_protocol() {
    let plane = tessera_e2e::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(
        &gpus,
        serde_yaml_ng::to_string(&json!({"devices": [
            {"uuid": "GPU-grpc-0", "index": 0, "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "numaNode": 0},
            {"uuid": "GPU-grpc-1", "index": 1, "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "numaNode": 1},
        ]}))
        .unwrap(),
    )
    .unwrap();
    let plugins = dir.path().join("device-plugins");
    let kubelet = KubeletSim::start(client.clone(), "grpc-node", &plugins, "nvidia.com/gpu")
        .await
        .unwrap();

    let (socket, mut states) = run_plugin(client, "grpc-node", dir.path(), &gpus, &plugins).await;

    // Registration: right version, resource and socket name, with options.
    let state = kubelet
        .wait_for("registration", Duration::from_secs(30), |s| {
            s.plugin.is_some()
        })
        .await
        .unwrap();
    // The agent reports the registration (the GpuNode's Ready condition follows it).
    tokio::time::timeout(
        Duration::from_secs(5),
        states.wait_for(|s| *s == plugin::PluginState::Registered),
    )
    .await
    .expect("registration reported")
    .unwrap();
    let (registered, options) = state.plugin.unwrap();
    assert_eq!(registered, "tessera-nvidia-com-gpu.sock");
    assert!(options.get_preferred_allocation_available);
    assert!(!options.pre_start_required);

    let mut plugin = DevicePluginClient::new(connect_unix(&socket).await.unwrap());
    let options = plugin
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);

    // ListAndWatch: 10 replicas per GPU, healthy, with their NUMA node.
    let mut stream = plugin.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 20);
    let replica = first
        .devices
        .iter()
        .find(|d| d.id == "GPU-grpc-1::3")
        .unwrap();
    assert_eq!(replica.health, "Healthy");
    assert_eq!(replica.topology.as_ref().unwrap().nodes[0].id, 1);

    // Without a pending pod the preference is any valid choice of the right size.
    let available: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
    let preferred = plugin
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.clone(),
                must_include_device_i_ds: vec!["GPU-grpc-1::9".into()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let ids = &preferred.container_responses[0].device_i_ds;
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], "GPU-grpc-1::9", "must-include devices come first");
    assert!(ids.iter().all(|id| available.contains(id)));

    // Allocate with no NodeLock: refused with a message the kubelet shows.
    let refused = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["GPU-grpc-0::0".into()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains("node grpc-node has no NodeLock: no GPU pod is waiting for devices here"),
        "{}",
        refused.message()
    );

    plugin
        .pre_start_container(PreStartContainerRequest {
            devices_ids: vec!["GPU-grpc-0::0".into()],
        })
        .await
        .unwrap();
}

/// A starting kubelet empties its device-plugin directory before it creates
/// kubelet.sock, which can remove the plugin's socket before the plugin ever
/// registered: the plugin serves again on a new socket and registers.
#[tokio::test]
async fn the_plugin_recovers_its_socket_removed_before_registration() {
    let plane = tessera_e2e::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(
        &gpus,
        "devices:\n- {uuid: GPU-early-0, index: 0, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920}\n",
    )
    .unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let (socket, mut states) =
        run_plugin(client.clone(), "early-node", dir.path(), &gpus, &plugins).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plugin never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // What the kubelet's device manager does when it starts.
    for entry in std::fs::read_dir(&plugins).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let kubelet = KubeletSim::start(client, "early-node", &plugins, "nvidia.com/gpu")
        .await
        .unwrap();
    kubelet
        .wait_for("registration", Duration::from_secs(10), |s| {
            s.plugin.is_some()
        })
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        states.wait_for(|s| *s == plugin::PluginState::Registered),
    )
    .await
    .expect("registration reported")
    .unwrap();
    kubelet
        .wait_for("devices", Duration::from_secs(10), |s| {
            !s.devices.is_empty()
        })
        .await
        .unwrap();
}

/// The kubelet holds a pod's admission on GetPreferredAllocation, and an
/// agent restarted during the call loses the pod for good: a preference,
/// being only advice, is answered at once (without one) when the API server
/// does not answer, not after the outage.
#[tokio::test]
async fn the_preference_does_not_wait_for_a_silent_api_server() {
    let plane = tessera_e2e::shared().await.unwrap();
    let (client, freeze) = plane.freezable_client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(
        &gpus,
        "devices:\n- {uuid: GPU-silent-0, index: 0, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920}\n",
    )
    .unwrap();
    let plugins = dir.path().join("device-plugins");
    let kubelet = KubeletSim::start(
        plane.client().await.unwrap(),
        "silent-node",
        &plugins,
        "nvidia.com/gpu",
    )
    .await
    .unwrap();
    let (socket, _states) = run_plugin(client, "silent-node", dir.path(), &gpus, &plugins).await;
    kubelet
        .wait_for("devices", Duration::from_secs(30), |s| {
            !s.devices.is_empty()
        })
        .await
        .unwrap();
    let mut plugin = DevicePluginClient::new(connect_unix(&socket).await.unwrap());

    // Every request of the agent's hangs from now on.
    freeze.send(true).unwrap();
    let started = std::time::Instant::now();
    let preferred = tokio::time::timeout(
        Duration::from_secs(5),
        plugin.get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["GPU-silent-0::0".into(), "GPU-silent-0::1".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        }),
    )
    .await
    .expect("GetPreferredAllocation answered while the API server is silent")
    .unwrap()
    .into_inner();
    let waited = started.elapsed();
    assert_eq!(
        preferred.container_responses[0].device_i_ds,
        ["GPU-silent-0::0"],
        "without a lock to steer by, the first available device"
    );
    assert!(
        waited < Duration::from_secs(3),
        "the preference waited {waited:?} for a silent API server"
    );
    freeze.send(false).unwrap();
}
