//! Builders for Tessera's custom resources in tests and benchmarks (feature
//! `testing`): one place that knows every field, so a change to a type
//! touches this file instead of every fixture.
//!
//! Each builder starts from what a real writer produces (the node agent's
//! GpuNode, Bind's VgpuAllocation and NodeLock) and lets a test change only
//! what it is about:
//!
//! ```
//! use tessera_api::testing::{allocation, container, slice};
//! use tessera_api::v1alpha1::AllocationPhase;
//!
//! let a = allocation("train", "uid-1", "node-1")
//!     .namespace("ml")
//!     .container(container("main", vec![slice("GPU-0", 0, 1000, 30)]))
//!     .phase(AllocationPhase::Allocated)
//!     .build();
//! assert_eq!(a.spec.totals.memory_mib, 1000);
//! ```

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{SignedDuration, Timestamp},
};
use kube::api::ObjectMeta;

use crate::v1alpha1::{
    AllocationPhase, AllocationTotals, ContainerAllocation, DeviceCapacity, DeviceHealth,
    DeviceSlice, GpuDevice, GpuNode, GpuNodeSpec, GpuNodeStatus, NodeLock, NodeLockSpec,
    OperatingMode, PodReference, SchedulingPolicy, VgpuAllocation, VgpuAllocationSpec,
    VgpuAllocationStatus,
};

/// The model fixtures use unless a test names another.
pub const MODEL: &str = "NVIDIA A100-SXM4-80GB";

/// A slice of device `uuid` (index `index`, model [`MODEL`]).
pub fn slice(uuid: &str, index: u32, memory_mib: u64, cores: u32) -> DeviceSlice {
    DeviceSlice {
        mutex: false,
        family: Default::default(),
        template: None,
        uuid: uuid.into(),
        index,
        model: MODEL.into(),
        memory_mib,
        cores,
        mig: None,
        core_indexes: Vec::new(),
        sharing: None,
    }
}

/// A container's allocation, without a priority.
pub fn container(name: &str, devices: Vec<DeviceSlice>) -> ContainerAllocation {
    ContainerAllocation {
        name: name.into(),
        devices,
        priority: None,
    }
}

/// A VgpuAllocation as Bind writes it: named after its pod, in namespace
/// `default`, spread over GPUs and binpacked over nodes, totals computed
/// from the containers at [`AllocationBuilder::build`].
pub fn allocation(pod_name: &str, pod_uid: &str, node: &str) -> AllocationBuilder {
    AllocationBuilder {
        metadata: ObjectMeta {
            name: Some(pod_name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: VgpuAllocationSpec {
            quota: Default::default(),
            pod_name: pod_name.into(),
            pod_uid: pod_uid.into(),
            node_name: node.into(),
            containers: Vec::new(),
            gpu_policy: Some(SchedulingPolicy::Spread),
            node_policy: Some(SchedulingPolicy::Binpack),
            claim: None,
            totals: AllocationTotals::default(),
            trace_context: None,
            priority: None,
            nomination: None,
        },
        status: None,
    }
}

/// See [`allocation`].
#[derive(Clone, Debug)]
#[must_use]
pub struct AllocationBuilder {
    metadata: ObjectMeta,
    spec: VgpuAllocationSpec,
    status: Option<VgpuAllocationStatus>,
}

impl AllocationBuilder {
    /// The allocation's (and its pod's) namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.metadata.namespace = Some(namespace.into());
        self
    }

    /// Changes the object's metadata (owner references, timestamps, ...).
    pub fn metadata(mut self, change: impl FnOnce(&mut ObjectMeta)) -> Self {
        change(&mut self.metadata);
        self
    }

    /// Adds a container.
    pub fn container(mut self, container: ContainerAllocation) -> Self {
        self.spec.containers.push(container);
        self
    }

    /// Adds containers.
    pub fn containers(mut self, containers: impl IntoIterator<Item = ContainerAllocation>) -> Self {
        self.spec.containers.extend(containers);
        self
    }

    /// The GPU and node policies.
    pub fn policies(mut self, gpu: SchedulingPolicy, node: SchedulingPolicy) -> Self {
        self.spec.gpu_policy = Some(gpu);
        self.spec.node_policy = Some(node);
        self
    }

    /// Makes it the DRA mirror of claim `name` (UID `uid`): named
    /// `claim-<uid>`, without scheduling policies.
    pub fn claim(mut self, name: &str, uid: &str) -> Self {
        self.metadata.name = Some(format!("claim-{uid}"));
        self.spec.gpu_policy = None;
        self.spec.node_policy = None;
        self.spec.claim = Some(crate::v1alpha1::ClaimReference {
            name: name.into(),
            uid: uid.into(),
        });
        self
    }

    /// Makes it a hold for a preemptor, lapsing at `expires_at`.
    pub fn held_until(mut self, expires_at: k8s_openapi::jiff::Timestamp) -> Self {
        self.spec.nomination = Some(crate::v1alpha1::Nomination {
            expires_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(expires_at),
            victims: vec!["default/victim".into()],
        });
        self
    }

    /// The status phase.
    pub fn phase(mut self, phase: AllocationPhase) -> Self {
        self.status.get_or_insert_default().phase = Some(phase);
        self
    }

    /// The status phase, or none (a status without a phase).
    pub fn maybe_phase(mut self, phase: Option<AllocationPhase>) -> Self {
        self.status.get_or_insert_default().phase = phase;
        self
    }

    /// Containers the node agent has served (status).
    pub fn served(mut self, containers: &[&str]) -> Self {
        self.status.get_or_insert_default().served_containers =
            containers.iter().map(|c| (*c).to_owned()).collect();
        self
    }

    /// The allocation, with its totals.
    pub fn build(mut self) -> VgpuAllocation {
        self.spec.totals = AllocationTotals::of(&self.spec.containers);
        VgpuAllocation {
            metadata: self.metadata,
            spec: self.spec,
            status: self.status,
        }
    }
}

/// A healthy GPU as the node agent publishes it: UUID `GPU-<index>`,
/// all of its memory and 100 % cores offered, split 10 ways, hami-core.
pub fn gpu(index: u32, model: &str, memory_mib: u64) -> GpuDevice {
    GpuDevice {
        cordoned_by: None,
        family: Default::default(),
        network_id: None,
        uuid: format!("GPU-{index}"),
        index,
        model: model.into(),
        memory_mib,
        capacity: DeviceCapacity {
            memory_mib,
            cores: 100,
        },
        split_count: 10,
        numa_node: None,
        nvlink_peers: Vec::new(),
        compute_capability: None,
        driver_version: None,
        health: DeviceHealth::Healthy,
        health_message: None,
        mode: OperatingMode::HamiCore,
        mig_instances: Vec::new(),
        mig: None,
        profiles: Vec::new(),
        minor: None,
        qos_policy: None,
    }
}

/// A GpuNode named `name` with `devices` and its summary (count, models,
/// capacity), `Ready=True` as a registered agent writes it.
pub fn gpu_node(name: &str, devices: Vec<GpuDevice>) -> GpuNode {
    let mut node = GpuNode::new(name, GpuNodeSpec {});
    node.status = Some(gpu_node_status(devices));
    node
}

/// The status part of [`gpu_node`].
pub fn gpu_node_status(devices: Vec<GpuDevice>) -> GpuNodeStatus {
    GpuNodeStatus {
        conditions: vec![ready(true, "Registered", "test")],
        ..GpuNodeStatus::of_devices(devices)
    }
}

/// A `Ready` condition, `True` or `False`, last changed at the epoch.
pub fn ready(status: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// A pod reference.
pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> PodReference {
    PodReference {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// The NodeLock of `node` as Bind takes it: held by `holder` for its
/// allocation `allocation`, acquired at `acquired_at` for `ttl_seconds`.
pub fn node_lock(
    node: &str,
    holder: PodReference,
    allocation: &str,
    acquired_at: Timestamp,
    ttl_seconds: u32,
) -> NodeLock {
    let expires_at = acquired_at
        .checked_add(SignedDuration::from_secs(i64::from(ttl_seconds)))
        .unwrap_or(acquired_at);
    NodeLock::new(
        node,
        NodeLockSpec {
            holder,
            allocation: allocation.into(),
            acquired_at: Time(acquired_at),
            ttl_seconds,
            expires_at: Time(expires_at),
            draining: false,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_has_its_totals_and_status() {
        let a = allocation("p", "u", "n")
            .namespace("ml")
            .container(container("a", vec![slice("GPU-0", 0, 100, 10)]))
            .container(container(
                "b",
                vec![slice("GPU-0", 0, 50, 5), slice("GPU-1", 1, 25, 0)],
            ))
            .phase(AllocationPhase::Allocated)
            .served(&["a"])
            .build();
        assert_eq!(a.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(a.spec.totals.devices, "GPU-0,GPU-1");
        assert_eq!(a.spec.totals.memory_mib, 175);
        assert_eq!(a.spec.totals.cores, 15);
        let status = a.status.unwrap();
        assert_eq!(status.phase, Some(AllocationPhase::Allocated));
        assert_eq!(status.served_containers, ["a"]);
    }

    #[test]
    fn a_gpu_node_sums_its_devices() {
        let node = gpu_node("n", vec![gpu(0, MODEL, 1000), gpu(1, "H100", 2000)]);
        let status = node.status.unwrap();
        assert_eq!(status.gpu_count, 2);
        assert_eq!(status.models, format!("H100,{MODEL}"));
        assert_eq!(
            (
                status.capacity.memory_mib,
                status.capacity.cores,
                status.capacity.slices
            ),
            (3000, 200, 20)
        );
        assert_eq!(status.conditions[0].status, "True");
    }

    #[test]
    fn a_lock_expires_after_its_ttl() {
        let at = Timestamp::from_second(1_000).unwrap();
        let lock = node_lock("n", pod_ref("d", "p", "u"), "p", at, 60);
        assert_eq!(lock.spec.expires_at.0.as_second(), 1_060);
        assert_eq!(lock.metadata.name.as_deref(), Some("n"));
    }
}
