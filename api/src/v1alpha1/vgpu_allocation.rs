//! `VgpuAllocation`: the scheduler's decision for one pod.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{DeviceFamily, SchedulingPolicy, Sharing};
use super::mig::{MigSlice, ServedMigInstance};

/// Which GPU slices a pod got. Namespaced, named after the pod, owned by it.
///
/// The spec is written once, when the scheduler binds the pod, and never
/// changes; the node agent and the lifecycle controller advance `status`.
///
/// A pod that came through the DRA front door has one mirror allocation per
/// ResourceClaim instead: written by the node agent when it prepares the
/// claim, named `claim-<claim UID>`, owned by the claim, with `claim` set and
/// one entry in `containers` per request of the claim; the agent releases it
/// when it unprepares the claim.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "VgpuAllocation",
    plural = "vgpuallocations",
    shortname = "vgpu",
    category = "tessera",
    namespaced,
    status = "VgpuAllocationStatus",
    selectable = ".spec.nodeName",
    derive = "PartialEq",
    doc = "The GPU slices Tessera's scheduler gave one pod: devices per container with memory and cores. The spec is immutable; status follows the pod from Bound to Allocated to Released.",
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".spec.podName",
        description = "The pod the slices belong to"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.nodeName",
        description = "The node the pod is bound to"
    ),
    printcolumn(
        name = "Devices",
        type_ = "string",
        json_path = ".spec.totals.devices",
        description = "GPU UUIDs the pod uses"
    ),
    printcolumn(
        name = "Family",
        type_ = "string",
        json_path = ".spec.totals.families",
        description = "Accelerator families of the slices (nvidia, ascend, hygon)"
    ),
    printcolumn(
        name = "Memory",
        type_ = "integer",
        json_path = ".spec.totals.memoryMiB",
        description = "Device memory in MiB over all slices"
    ),
    printcolumn(
        name = "Cores",
        type_ = "integer",
        json_path = ".spec.totals.cores",
        description = "Percent of SMs over all slices"
    ),
    printcolumn(
        name = "Claim",
        type_ = "string",
        json_path = ".spec.claim.name",
        description = "The ResourceClaim this allocation mirrors (DRA front door)"
    ),
    printcolumn(
        name = "Held-Until",
        type_ = "string",
        json_path = ".spec.nomination.expiresAt",
        description = "Slices held for a preemptor that is not bound yet, until then"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Bound, Allocated, Released or Failed"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec is immutable: it records a scheduling decision; delete the pod to release it"))]
#[x_kube(validation = Rule::new("self.totals.memoryMiB == self.containers.map(c, c.devices.map(d, d.memoryMiB).sum()).sum()").message("totals.memoryMiB must equal the sum of every device slice's memoryMiB"))]
#[x_kube(validation = Rule::new("self.totals.cores == self.containers.map(c, c.devices.map(d, d.cores).sum()).sum()").message("totals.cores must equal the sum of every device slice's cores"))]
pub struct VgpuAllocationSpec {
    /// Name of the pod.
    #[schemars(length(min = 1, max = 253))]
    pub pod_name: String,
    /// UID of the pod; an allocation never serves a later pod of the same name.
    #[schemars(length(min = 1, max = 64))]
    pub pod_uid: String,
    /// The node the pod was bound to.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// The GPU containers in the order the kubelet starts them (init containers
    /// first); containers without GPU requests are absent. In a DRA mirror,
    /// the claim's requests (named as in the claim).
    #[schemars(length(min = 1, max = 64))]
    pub containers: Vec<ContainerAllocation>,
    /// The GPU policy used to pick devices on the node; absent in a DRA
    /// mirror (kube-scheduler's DynamicResources plugin picked them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_policy: Option<SchedulingPolicy>,
    /// The node policy used to rank nodes; absent in a DRA mirror.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_policy: Option<SchedulingPolicy>,
    /// The ResourceClaim (in the allocation's namespace) this allocation
    /// mirrors, when the slices came through the DRA front door.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimReference>,
    /// Sums over all slices, for `kubectl get` and quick checks.
    pub totals: AllocationTotals,
    /// What the pod counts against its namespace's ResourceQuotas, by
    /// device resource name (`nvidia.com/gpumem`: MiB; `nvidia.com/gpucores`:
    /// cores as the slices hold them), percentages resolved on the devices
    /// it got and init containers counted as the kubelet counts them; absent
    /// in a DRA mirror.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 64))]
    pub quota: BTreeMap<String, u64>,
    /// The W3C trace context of the scheduling decision, so the node agent's
    /// work joins the same trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<TraceContext>,
    /// The pod's priority (`spec.priority`) when its slices were given:
    /// device-aware preemption displaces only pods of lower priority.
    /// Absent in a DRA mirror and in allocations written before Tessera
    /// recorded it; those are never displaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Set while the slices are only held for a pod that preempted others
    /// and is not bound yet: its Bind replaces this allocation with its
    /// own, and the lifecycle controller releases the hold at `expiresAt`
    /// if the pod has not bound by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nomination: Option<Nomination>,
}

/// Slices held for a preemptor until it binds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Nomination {
    /// When the hold lapses if the pod has not bound.
    pub expires_at: Time,
    /// The pods displaced to free the slices, as `namespace/name`.
    #[schemars(length(max = 64))]
    pub victims: Vec<String>,
}

/// A ResourceClaim in the allocation's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimReference {
    /// The claim's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The claim's UID; the mirror never serves a later claim of that name.
    #[schemars(length(min = 1, max = 64))]
    pub uid: String,
}

/// The slices one container got.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAllocation {
    /// The container's name in the pod spec (in a DRA mirror, the claim's
    /// request name).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// One slice per requested vGPU, each on a different GPU.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(validation = Rule::new("self.all(d, self.exists_one(e, e.uuid == d.uuid))").message("devices: a container gets at most one slice of each GPU"))]
    pub devices: Vec<DeviceSlice>,
    /// The container's compute priority from `nvidia.com/priority` (0 high,
    /// 1 low), handed to the interposer as `CUDA_TASK_PRIORITY`; absent when
    /// the pod did not ask (low).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1))]
    pub priority: Option<u32>,
}

/// A slice of one GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.cores <= 100 || (has(self.family) && self.family == 'amd')").message("cores must be at most 100 (percent of the device) except on AMD GPUs, whose cores are compute units"))]
#[x_kube(validation = Rule::new("self.memoryMiB >= 1 || (has(self.family) && self.family in ['awsneuron', 'vastai', 'biren'])").message("memoryMiB must be at least 1 except on AWS Neuron devices, which have no memory to share, and on Vastai and Biren devices, which are counted, not measured"))]
pub struct DeviceSlice {
    /// The GPU's UUID.
    #[schemars(length(min = 1, max = 128))]
    pub uuid: String,
    /// The GPU's index on the node.
    pub index: u32,
    /// The device's accelerator family; absent means `nvidia`.
    #[serde(default, skip_serializing_if = "DeviceFamily::is_nvidia")]
    pub family: DeviceFamily,
    /// The GPU's model, for display.
    #[serde(default)]
    pub model: String,
    /// The vendor's partition template the slice is cut as, where the vendor
    /// has them (Ascend vNPU `vir04`): the memory is the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub template: Option<String>,
    /// Device memory in MiB (at least 1; AWS Neuron: 0).
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Percent of the GPU's SMs; 100 means the GPU is the container's
    /// alone. Vendors count in their own unit where HAMi does: AMD compute
    /// units, Moore Threads sixteenths, AWS NeuronCores.
    #[schemars(range(max = 100000))]
    pub cores: u32,
    /// The device's cores this slice holds, by their index on the device
    /// (0, 1, ...), where the vendor's plugin hands cores out by index (AWS
    /// NeuronCores of a container that asked for cores).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub core_indexes: Vec<u32>,
    /// How the slice shares its GPU (MetaX sGPUs: the pod's app class and
    /// QoS policy, which decide the GPU's later tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    /// The MIG instance that serves this slice, on a dynamic-MIG GPU: the
    /// node agent creates it at Allocate and destroys it at release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigSlice>,
    /// The pod took this GPU under the `mutex` GPU policy
    /// (`hami.io/gpu-scheduler-policy`): the GPU was idle, and takes no
    /// other slice while this one lives.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mutex: bool,
}

/// Sums over every slice of an allocation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationTotals {
    /// The distinct GPU UUIDs, comma-separated, in first-use order.
    pub devices: String,
    /// The distinct accelerator families of the slices, comma-separated,
    /// sorted (`nvidia`, `ascend,nvidia`); empty in objects written before
    /// families existed (all `nvidia`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub families: String,
    /// Device memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Percent of SMs.
    pub cores: u32,
}

impl VgpuAllocation {
    /// The name of the region directory of one of its containers, under the
    /// node's regions root: `<pod UID>_<container>`, or for a DRA mirror
    /// `<claim UID>_<request>` (several pods may share a claim, and a pod may
    /// hold several claims with the same request names).
    pub fn region_name(&self, container: &str) -> String {
        format!("{}_{container}", self.region_owner())
    }

    /// Whose region directories these are: the claim's UID for a DRA
    /// mirror, else the pod's (the part of [`Self::region_name`] before `_`).
    pub fn region_owner(&self) -> &str {
        self.spec
            .claim
            .as_ref()
            .map_or(self.spec.pod_uid.as_str(), |c| c.uid.as_str())
    }

    /// Whether any of its slices is on a device of `family`. On a node
    /// whose NVIDIA GPUs Tessera's node agent serves and whose other
    /// devices another vendor's plugin serves, each sees only its own.
    pub fn has_family(&self, family: DeviceFamily) -> bool {
        self.spec
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .any(|slice| slice.family == family)
    }

    /// Whether the allocation still holds its slices: every phase but
    /// `Released` and `Failed` (no status yet counts as holding).
    pub fn is_live(&self) -> bool {
        !matches!(
            self.status.as_ref().and_then(|s| s.phase),
            Some(AllocationPhase::Released | AllocationPhase::Failed)
        )
    }
}

impl AllocationTotals {
    /// Computes the totals of a set of container allocations.
    pub fn of(containers: &[ContainerAllocation]) -> Self {
        let mut uuids: Vec<&str> = Vec::new();
        let mut families = std::collections::BTreeSet::new();
        let mut totals = Self::default();
        for slice in containers.iter().flat_map(|c| &c.devices) {
            if !uuids.contains(&slice.uuid.as_str()) {
                uuids.push(&slice.uuid);
            }
            families.insert(slice.family.as_str());
            totals.memory_mib += slice.memory_mib;
            totals.cores += slice.cores;
        }
        totals.devices = uuids.join(",");
        totals.families = families.into_iter().collect::<Vec<_>>().join(",");
        totals
    }
}

/// A W3C trace context (https://www.w3.org/TR/trace-context/).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceContext {
    /// The `traceparent` header value.
    #[schemars(length(max = 55))]
    pub traceparent: String,
    /// The `tracestate` header value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 512))]
    pub tracestate: String,
}

/// Where an allocation is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AllocationPhase {
    /// The pod is bound to the node; the kubelet has not yet asked for its devices.
    Bound,
    /// Every GPU container has been served by the node agent.
    Allocated,
    /// The pod finished or was deleted; the slices are free again.
    Released,
    /// The node agent could not serve the pod; `message` says why.
    Failed,
}

/// What happened to the allocation since the scheduler wrote it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VgpuAllocationStatus {
    /// Where the allocation is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AllocationPhase>,
    /// Containers the node agent has served at `Allocate`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served_containers: Vec<String>,
    /// MIG instances the node agent created for the containers (dynamic MIG).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub mig_instances: Vec<ServedMigInstance>,
    /// When the last container was served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_at: Option<Time>,
    /// When the slices were released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// A human-readable explanation of the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
