//! Status writes by server-side apply against a real API server, as the
//! controller and the node agent make them: an allocation's phase passes
//! between them without either erasing the other's fields, a write guarded
//! by a version fails on a newer one, and the controller's Ready=Unknown
//! touches nothing of the agent's GpuNode but that condition.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use tessera_api::{
    testing,
    v1alpha1::{
        AllocationPhase, GpuDevice, GpuNode, GpuNodeSpec, GpuNodeStatus, VgpuAllocation,
        VgpuAllocationStatus,
    },
};
use tessera_e2e::ControlPlane;
use tessera_kubekit::StatusWriter;

const CONTROLLER: StatusWriter = StatusWriter::new(tessera_controllers::FIELD_MANAGER);
const AGENT: StatusWriter = StatusWriter::new("tessera-node-agent");

fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap())
}

async fn allocation(client: &Client, name: &str) -> (Api<VgpuAllocation>, VgpuAllocation) {
    let api = Api::<VgpuAllocation>::namespaced(client.clone(), "default");
    let object = testing::allocation(name, &format!("uid-{name}"), "n1")
        .container(testing::container(
            "main",
            vec![testing::slice("GPU-1", 0, 100, 10)],
        ))
        .build();
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    (api, created)
}

fn version(object: &VgpuAllocation) -> Option<&str> {
    object.metadata.resource_version.as_deref()
}

#[tokio::test]
async fn status_writes_by_apply_keep_each_other_s_fields() {
    let plane = ControlPlane::start().await.unwrap();
    let client = plane.client().await.unwrap();

    // Bind, the agent, then the lifecycle controller.
    let (api, created) = allocation(&client, "served").await;
    let bound = VgpuAllocationStatus {
        phase: Some(AllocationPhase::Bound),
        ..Default::default()
    };
    let bound = CONTROLLER
        .apply_at(&api, "served", version(&created), &bound)
        .await
        .unwrap();
    let stale = CONTROLLER
        .apply_at(
            &api,
            "served",
            version(&created),
            &VgpuAllocationStatus::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&stale, kube::Error::Api(s) if s.is_conflict()),
        "a version in the apply is a precondition: {stale}"
    );
    let allocated_at = now();
    let served = VgpuAllocationStatus {
        served_containers: vec!["main".to_owned()],
        phase: Some(AllocationPhase::Allocated),
        allocated_at: Some(allocated_at.clone()),
        ..Default::default()
    };
    let served = AGENT
        .apply_at(&api, "served", version(&bound), &served)
        .await
        .unwrap();
    let released = VgpuAllocationStatus {
        phase: Some(AllocationPhase::Released),
        released_at: Some(now()),
        message: Some("the pod finished (Succeeded)".to_owned()),
        allocated_at: served.status.as_ref().unwrap().allocated_at.clone(),
        ..Default::default()
    };
    let released = CONTROLLER
        .apply_at(&api, "served", version(&served), &released)
        .await
        .unwrap();
    let status = released.status.unwrap();
    assert_eq!(status.phase, Some(AllocationPhase::Released));
    assert_eq!(status.served_containers, ["main"], "the agent's list stays");
    assert_eq!(status.allocated_at, Some(allocated_at));
    assert!(status.released_at.is_some() && status.message.is_some());

    // The controller's own fallback (Allocated), then its release: what it
    // owned and leaves out would be removed, so the release carries it.
    let (api, created) = allocation(&client, "unrecorded").await;
    let allocated_at = now();
    let allocated = VgpuAllocationStatus {
        phase: Some(AllocationPhase::Allocated),
        allocated_at: Some(allocated_at.clone()),
        message: Some("the pod's containers started".to_owned()),
        ..Default::default()
    };
    let allocated = CONTROLLER
        .apply_at(&api, "unrecorded", version(&created), &allocated)
        .await
        .unwrap();
    let mut released = VgpuAllocationStatus {
        phase: Some(AllocationPhase::Released),
        released_at: Some(now()),
        message: Some("the pod was deleted".to_owned()),
        ..Default::default()
    };
    let forgot = CONTROLLER
        .apply_at(&api, "unrecorded", version(&allocated), &released)
        .await
        .unwrap();
    assert_eq!(
        forgot.status.unwrap().allocated_at,
        None,
        "left out by its only owner: removed"
    );
    released.allocated_at = Some(allocated_at.clone());
    let kept = CONTROLLER
        .apply_at(&api, "unrecorded", None, &released)
        .await
        .unwrap();
    assert_eq!(kept.status.unwrap().allocated_at, Some(allocated_at));
}

fn ready(status: &str, reason: &str) -> Condition {
    Condition {
        type_: "Ready".to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: String::new(),
        last_transition_time: now(),
        observed_generation: None,
    }
}

#[tokio::test]
async fn one_condition_applied_leaves_the_rest_of_the_gpu_node() {
    let plane = ControlPlane::start().await.unwrap();
    let client = plane.client().await.unwrap();
    let api = Api::<GpuNode>::all(client.clone());
    api.create(&PostParams::default(), &GpuNode::new("n1", GpuNodeSpec {}))
        .await
        .unwrap();
    let device = |uuid: &str| GpuDevice {
        family: Default::default(),
        network_id: None,
        uuid: uuid.into(),
        ..testing::gpu(0, "m", 100)
    };
    let mut agent = GpuNodeStatus {
        devices: vec![device("GPU-a"), device("GPU-b")],
        gpu_count: 2,
        models: "m".to_owned(),
        conditions: vec![ready("True", "AllGpusHealthy")],
        ..Default::default()
    };
    let written = AGENT.apply_at(&api, "n1", None, &agent).await.unwrap();

    let lapsed = GpuNodeStatus {
        conditions: vec![ready("Unknown", "AgentLeaseExpired")],
        ..Default::default()
    };
    let version = written.metadata.resource_version.as_deref();
    let marked = CONTROLLER
        .apply_part_at(&api, "n1", version, &lapsed)
        .await
        .unwrap();
    let status = marked.status.unwrap();
    assert_eq!(status.gpu_count, 2, "the agent's fields stay");
    assert_eq!(status.devices.len(), 2);
    assert_eq!(status.conditions.len(), 1);
    assert_eq!(status.conditions[0].reason, "AgentLeaseExpired");

    agent.devices.pop();
    agent.gpu_count = 1;
    let back = AGENT.apply_at(&api, "n1", None, &agent).await.unwrap();
    let status = back.status.unwrap();
    assert_eq!(status.conditions[0].reason, "AllGpusHealthy", "taken back");
    assert_eq!(status.devices.len(), 1, "a device left out is removed");
    assert_eq!(status.gpu_count, 1);
}
