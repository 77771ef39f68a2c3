use pretty_assertions::assert_eq;
use tessera_api::v1alpha1::{
    AllocationPhase, MigStrategy, NodeSettings, OperatingMode, VgpuAllocationStatus,
};
use tessera_deviceplugin::podresources::v1::{ContainerDevices, ContainerResources};

use super::*;
use crate::plugin::static_mig::tests::node;

fn container(name: &str, devices: &[(&str, &[&str])]) -> ContainerResources {
    ContainerResources {
        name: name.into(),
        devices: devices
            .iter()
            .map(|(resource, ids)| ContainerDevices {
                resource_name: (*resource).into(),
                device_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
                topology: None,
            })
            .collect(),
        ..ContainerResources::default()
    }
}

fn pod(namespace: &str, name: &str, containers: Vec<ContainerResources>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers,
    }
}

/// The UUIDs of GPU-0's two `3g.20gb` instances, and the instances.
fn gpu0(offer: &Offer) -> Vec<MigInstance> {
    offer.devices[0].mig_instances.clone()
}

#[test]
fn a_pod_holding_static_instances_is_one_record_with_a_mig_slice_per_instance() {
    let dir = tempfile::tempdir().unwrap();
    let offer = node(dir.path(), MigStrategy::Mixed);
    let instances = gpu0(&offer);
    let listed = [
        pod(
            "ml",
            "train",
            vec![
                container(
                    "main",
                    &[(
                        "nvidia.com/mig-3g.20gb",
                        &[instances[1].uuid.as_str(), "MIG-stranger"],
                    )],
                ),
                // Another plugin's device, and a container with none.
                container("side", &[("example.com/nic", &["nic-0"])]),
                container("idle", &[]),
            ],
        ),
        pod("web", "frontend", vec![container("app", &[])]),
    ];
    let holds = holds(&offer, &listed);
    assert_eq!(holds.len(), 1, "only the pod holding an instance");
    let hold = &holds[0];
    assert_eq!(
        (hold.namespace.as_str(), hold.pod.as_str()),
        ("ml", "train")
    );
    assert_eq!(hold.containers.len(), 1);
    let slice = &hold.containers[0].devices[0];
    assert_eq!(
        hold.containers[0].devices.len(),
        1,
        "the stranger is skipped"
    );
    assert_eq!(slice.uuid, "GPU-0", "the slice is on the parent GPU");
    assert_eq!(slice.memory_mib, instances[1].memory_mib);
    // 3 of the A100's 7 compute slices.
    assert_eq!(slice.cores, 42);
    assert_eq!(
        slice.mig,
        Some(MigSlice {
            profile: "3g.20gb".into(),
            placement: instances[1].placement,
        })
    );
    assert_eq!(
        hold.served,
        [ServedMigInstance {
            container: "main".into(),
            gpu: "GPU-0".into(),
            uuid: instances[1].uuid.clone(),
        }]
    );

    // The record: named after the pod, owned by it, on this node.
    let record = record_of(hold, "uid-1", "n1");
    assert_eq!(record.name_any(), "train");
    let owner = &record.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Pod", "uid-1")
    );
    assert_eq!(record.spec.pod_uid, "uid-1");
    assert_eq!(record.spec.node_name, "n1");
    assert_eq!(record.spec.totals.memory_mib, instances[1].memory_mib);

    // The GpuNode names it as the instance's holder.
    let holders = crate::holders::holders(&[record]);
    let settings = NodeSettings {
        operating_mode: OperatingMode::Mig,
        mig_strategy: MigStrategy::Mixed,
        ..NodeSettings::default()
    };
    let physical = crate::backend::Backend::devices(&crate::backend::FakeBackend::new(
        dir.path().join("gpus.yaml"),
        dir.path().join("mig.json"),
    ))
    .unwrap();
    let offered = crate::settings::offered(&physical, &settings, &holders);
    let held: Vec<Option<&str>> = offered[0]
        .mig_instances
        .iter()
        .map(|i| i.held_by.as_deref())
        .collect();
    assert_eq!(held, [None, Some("ml/train")]);
}

#[test]
fn only_a_mixed_node_has_static_holds() {
    let dir = tempfile::tempdir().unwrap();
    let offer = node(dir.path(), MigStrategy::None);
    let uuid = gpu0(&offer)
        .first()
        .map(|i| i.uuid.clone())
        .unwrap_or_else(|| "MIG-any".into());
    let listed = [pod(
        "ml",
        "train",
        vec![container("main", &[("nvidia.com/mig-3g.20gb", &[&uuid])])],
    )];
    assert!(holds(&offer, &listed).is_empty());
}

#[test]
fn a_hold_already_in_the_ledger_in_any_phase_is_not_recorded_again() {
    let dir = tempfile::tempdir().unwrap();
    let offer = node(dir.path(), MigStrategy::Mixed);
    let instances = gpu0(&offer);
    let listed = [
        pod(
            "ml",
            "a",
            vec![container(
                "main",
                &[("nvidia.com/mig-3g.20gb", &[&instances[0].uuid])],
            )],
        ),
        pod(
            "ml",
            "b",
            vec![container(
                "main",
                &[("nvidia.com/mig-3g.20gb", &[&instances[1].uuid])],
            )],
        ),
    ];
    let found = holds(&offer, &listed);
    assert_eq!(unrecorded(found.clone(), &[]).len(), 2);
    let mut released = record_of(&found[0], "uid-a", "n1");
    released.status = Some(VgpuAllocationStatus {
        phase: Some(AllocationPhase::Released),
        ..VgpuAllocationStatus::default()
    });
    // b's name holds an earlier pod's other instance: recorded anew.
    let mut earlier = record_of(&found[1], "uid-old", "n1");
    earlier.spec.containers[0].devices[0].mig = Some(MigSlice {
        profile: "3g.20gb".into(),
        placement: instances[0].placement,
    });
    let left = unrecorded(found, &[released, earlier]);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].pod, "b");
}

/// A mixed node (static MIG and a vendor plugin): a pod holding a static
/// instance and a Hygon DCU slice Bind wrote under the pod's name.
#[test]
fn a_hold_never_replaces_the_allocation_the_scheduler_wrote_for_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let offer = node(dir.path(), MigStrategy::Mixed);
    let instances = gpu0(&offer);
    let listed = [pod(
        "ml",
        "mixed",
        vec![container(
            "main",
            &[("nvidia.com/mig-3g.20gb", &[&instances[0].uuid])],
        )],
    )];
    let found = holds(&offer, &listed);
    assert_eq!(found.len(), 1);
    let mut dcu = tessera_api::testing::slice("DCU-0", 0, 4096, 25);
    dcu.family = tessera_api::v1alpha1::DeviceFamily::Hygon;
    let bound = tessera_api::testing::allocation("mixed", "uid-m", "n1")
        .namespace("ml")
        .container(tessera_api::testing::container("main", vec![dcu]))
        .build();
    // What the agent's pass sees: every allocation of the node.
    assert!(
        unrecorded(found.clone(), std::slice::from_ref(&bound)).is_empty(),
        "nothing to record over the scheduler's allocation"
    );
    assert_eq!(
        scheduler_held(&found, std::slice::from_ref(&bound)).len(),
        1
    );
    // And were it asked, the ledger keeps it rather than deleting it.
    let record = record_of(&found[0], "uid-m", "n1");
    assert_eq!(
        crate::ledger::existing(&bound, &record),
        crate::ledger::Existing::Scheduler
    );
}
