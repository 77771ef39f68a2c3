use std::sync::Arc;

use tessera_api::v1alpha1::{MigStrategy, NodeSettings, OperatingMode};
use tessera_deviceplugin::v1beta1::ContainerAllocateRequest;

use super::*;
use crate::{
    backend::{Backend, FakeBackend},
    holders::MigHolders,
    settings::offered,
};

/// A node with two A100-40GB GPUs in MIG mode, the operator's geometry on
/// them, under `strategy`.
pub(crate) fn node(dir: &std::path::Path, strategy: MigStrategy) -> Offer {
    let gpus = dir.join("gpus.yaml");
    std::fs::write(
        &gpus,
        "devices:\n\
         - {uuid: GPU-0, index: 0, model: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 0}\n\
         - {uuid: GPU-1, index: 1, model: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 1}\n\
         mig:\n  enabled: [GPU-0, GPU-1]\n  geometry:\n    GPU-0: [3g.20gb, 3g.20gb]\n    GPU-1: [1g.5gb+me, 2g.10gb]\n",
    )
    .unwrap();
    let backend = Arc::new(FakeBackend::new(gpus, dir.join("mig.json")));
    let settings = NodeSettings {
        operating_mode: OperatingMode::Mig,
        mig_strategy: strategy,
        ..NodeSettings::default()
    };
    Offer {
        resolved: tessera_api::node_config::resolve("n1", &Default::default(), &settings, &[]),
        devices: offered(&backend.devices().unwrap(), &settings, &MigHolders::new()),
    }
}

#[test]
fn mixed_offers_each_profile_as_its_own_resource() {
    let dir = tempfile::tempdir().unwrap();
    let offer = node(dir.path(), MigStrategy::Mixed);
    let by_resource = static_instances(&offer);
    let names: Vec<&str> = by_resource.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "nvidia.com/mig-1g.5gb.me",
            "nvidia.com/mig-2g.10gb",
            "nvidia.com/mig-3g.20gb"
        ]
    );
    let big = &by_resource["nvidia.com/mig-3g.20gb"];
    assert_eq!(big.len(), 2);
    assert!(big.iter().all(|i| i.uuid.starts_with("MIG-") && i.healthy));
    assert!(big.iter().all(|i| i.numa_node == Some(0)));
    // No nvidia.com/gpu slice on a mixed GPU: the ledger cannot book them.
    assert!(offer.devices.iter().all(|d| d.split_count == 0));
    // Other modes serve no static resource.
    let dir = tempfile::tempdir().unwrap();
    assert!(static_instances(&node(dir.path(), MigStrategy::None)).is_empty());
}

#[tokio::test]
async fn allocate_hands_out_the_chosen_instances_and_refuses_strangers() {
    let dir = tempfile::tempdir().unwrap();
    let offer = node(dir.path(), MigStrategy::Mixed);
    let uuids: Vec<String> = static_instances(&offer)["nvidia.com/mig-3g.20gb"]
        .iter()
        .map(|i| i.uuid.clone())
        .collect();
    let (_, offers) = watch::channel(offer);
    let service = StaticMigService::new(
        "nvidia.com/mig-3g.20gb".into(),
        offers,
        DeviceList::default(),
    );
    let ask = |ids: Vec<String>| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
    };
    let answer = service
        .allocate(Request::new(ask(vec![uuids[1].clone()])))
        .await
        .unwrap()
        .into_inner();
    let envs = &answer.container_responses[0].envs;
    assert_eq!(envs.len(), 1, "{envs:?}");
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], uuids[1]);
    assert!(
        answer.container_responses[0].mounts.is_empty(),
        "no interposer"
    );
    let error = service
        .allocate(Request::new(ask(vec!["MIG-not-here".into()])))
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::FailedPrecondition);
    assert!(
        error.message().contains("MIG-not-here"),
        "{}",
        error.message()
    );
    let mut stream = service
        .list_and_watch(Request::new(Empty {}))
        .await
        .unwrap()
        .into_inner();
    let first = futures::StreamExt::next(&mut stream)
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, uuids.iter().map(String::as_str).collect::<Vec<_>>());
}
