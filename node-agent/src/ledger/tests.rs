use tessera_api::{testing, v1alpha1::DeviceFamily};

use super::*;

/// A pod's allocation as the scheduler's Bind writes it, holding one Hygon
/// DCU slice and nothing of the agent's GPUs.
fn vendor_only(name: &str, uid: &str) -> VgpuAllocation {
    let mut dcu = testing::slice("DCU-0", 0, 4096, 25);
    dcu.family = DeviceFamily::Hygon;
    let mut allocation = testing::allocation(name, uid, "n1")
        .namespace("ml")
        .container(testing::container("main", vec![dcu]))
        .build();
    allocation.spec.quota = [("hygon.com/dcumem".to_owned(), 4096)].into();
    allocation
}

#[test]
fn only_allocations_the_agent_wrote_are_replaced() {
    let found = vendor_only("train", "uid-1");
    assert!(!agent_written(&found));
    let mut record = found.clone();
    record.spec.containers[0].devices[0].family = DeviceFamily::Nvidia;
    record.spec.gpu_policy = None;
    record.spec.node_policy = None;
    record.spec.quota.clear();
    assert!(agent_written(&record));
    assert_eq!(existing(&found, &record), Existing::Scheduler);
    assert_eq!(existing(&record, &record), Existing::Same);

    // Each of the scheduler's marks alone keeps an NVIDIA allocation.
    let mut earlier = record.clone();
    earlier.spec.pod_uid = "uid-old".into();
    assert_eq!(existing(&earlier, &record), Existing::Earlier);
    let marks: [fn(&mut VgpuAllocationSpec); 4] = [
        |s| s.priority = Some(1000),
        |s| s.quota = [("nvidia.com/gpumem".to_owned(), 10)].into(),
        |s| s.gpu_policy = Some(tessera_api::v1alpha1::SchedulingPolicy::Spread),
        |s| s.containers[0].devices[0].family = DeviceFamily::Ascend,
    ];
    for (i, mark) in marks.iter().enumerate() {
        let mut marked = earlier.clone();
        mark(&mut marked.spec);
        assert_eq!(existing(&marked, &record), Existing::Scheduler, "mark {i}");
    }
}
