//! Names Tessera shares with pods, nodes and HAMi: the API group, extended
//! resource names and annotation keys. They are HAMi's, so manifests written
//! for HAMi keep working unchanged.
//!
//! Resource names are the defaults; clusters may rename them through the
//! controller's configuration (see `tessera_scheduling::request::ResourceNames`).

/// The API group of every Tessera custom resource.
pub const GROUP: &str = "tessera.dev";

/// The API version of every Tessera custom resource.
pub const VERSION: &str = "v1alpha1";

/// The scheduler name the webhook gives GPU pods unless configured otherwise.
pub const DEFAULT_SCHEDULER_NAME: &str = "tessera-scheduler";

/// The DRA front door's names.
pub mod dra {
    /// The DRA driver the node agents publish devices and prepare claims as.
    pub const DRIVER: &str = "gpu.tessera.dev";
    /// The DeviceClass that selects Tessera's GPUs (the chart installs it).
    pub const DEVICE_CLASS: &str = "vgpu.tessera.dev";
    /// The CDI kind (`vendor/class`) of the devices prepared claims get.
    pub const CDI_KIND: &str = "tessera.dev/vgpu";
}

/// Default extended resource names a container puts in `resources.limits`.
pub mod resources {
    /// Number of vGPUs; each one is on a different physical GPU.
    pub const GPU: &str = "nvidia.com/gpu";
    /// Device memory per vGPU in MiB.
    pub const GPU_MEMORY: &str = "nvidia.com/gpumem";
    /// Device memory per vGPU in percent of the device (1-100).
    pub const GPU_MEMORY_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
    /// Compute per vGPU in percent of the device's SMs (0-100; 100 is exclusive).
    pub const GPU_CORES: &str = "nvidia.com/gpucores";
    /// Task priority for the compute limiter (0 high, 1 low).
    pub const PRIORITY: &str = "nvidia.com/priority";
}

/// Pod annotations that steer placement.
pub mod annotations {
    /// Comma list; only GPUs whose model contains one of the entries (case-insensitive).
    pub const USE_GPU_TYPE: &str = "nvidia.com/use-gputype";
    /// Comma list; GPUs whose model contains one of the entries are excluded.
    pub const NOUSE_GPU_TYPE: &str = "nvidia.com/nouse-gputype";
    /// Comma list of GPU UUIDs; only these GPUs may be used.
    pub const USE_GPU_UUID: &str = "nvidia.com/use-gpuuuid";
    /// Comma list of GPU UUIDs that must not be used.
    pub const NOUSE_GPU_UUID: &str = "nvidia.com/nouse-gpuuuid";
    /// `"true"`: all GPUs of a container come from one NUMA node.
    pub const NUMA_BIND: &str = "nvidia.com/numa-bind";
    /// `hami-core`, `mig` or `mps`: the sharing mode the GPU must run in.
    pub const VGPU_MODE: &str = "nvidia.com/vgpu-mode";
    /// A comma list of `binpack` or `spread` (how GPUs are chosen within a
    /// node) and `mutex` (idle GPUs only, kept to the pod alone).
    pub const GPU_SCHEDULER_POLICY: &str = "hami.io/gpu-scheduler-policy";
    /// `slot=A,core=B,memory=C`: how much each of a GPU's slice, core and
    /// memory fractions weighs when GPUs within a node are ordered.
    pub const DEVICE_SCORING_WEIGHTS: &str = "hami.io/device-scoring-weights";
    /// Node annotation: comma list of device UUIDs that take no new pod;
    /// pods already on them are untouched.
    pub const DEVICE_CORDON: &str = "hami.io/device-cordon";
    /// `binpack` or `spread`: how nodes are ranked.
    pub const NODE_SCHEDULER_POLICY: &str = "hami.io/node-scheduler-policy";
}

/// Hygon DCUs' pod annotations (HAMi `pkg/device/hygon`).
pub mod hygon {
    /// The device type Hygon DCUs are keyed by in HAMi's hand-off (`DCU`).
    pub const DEVICE_TYPE: &str = "DCU";
    /// The Node annotation Hygon's plugin registers its DCUs in.
    pub const REGISTER: &str = "hami.io/node-dcu-register";
    /// The Node annotation of Hygon's register handshake.
    pub const HANDSHAKE: &str = "hami.io/node-handshake-dcu";
    /// Comma list; only DCUs whose type contains one of the entries.
    pub const USE_DCU_TYPE: &str = "hygon.com/use-dcutype";
    /// Comma list; DCUs whose type contains one of the entries are excluded.
    pub const NOUSE_DCU_TYPE: &str = "hygon.com/nouse-dcutype";
    /// Comma list of DCU UUIDs; only these may be used.
    pub const USE_UUID: &str = "hygon.com/use-gpuuuid";
    /// Comma list of DCU UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "hygon.com/nouse-gpuuuid";
}

/// Ascend NPUs' pod annotations (HAMi `pkg/device/ascend`).
pub mod ascend {
    /// The variable Ascend's container runtime reads the visible NPUs from;
    /// HAMi's `overwriteEnv` sets it empty in containers without NPUs.
    pub const VISIBLE_DEVICES: &str = "ASCEND_VISIBLE_DEVICES";
    /// `hami-core`: HAMi's hami-vnpu-core soft split instead of the driver's
    /// vNPU templates.
    pub const VNPU_MODE: &str = "huawei.com/vnpu-mode";
    /// The one value of [`VNPU_MODE`].
    pub const HAMI_CORE: &str = "hami-core";
    /// Node annotation: `"true"` when the node runs hami-vnpu-core.
    pub const NODE_SOFT_SPLIT: &str = "hami-vnpu-core";

    /// The pod annotation listing the NPUs of `device_type` a pod may use.
    pub fn use_uuid(device_type: &str) -> String {
        format!("hami.io/use-{device_type}-uuid")
    }

    /// The pod annotation listing NPUs of `device_type` a pod must not use.
    pub fn nouse_uuid(device_type: &str) -> String {
        format!("hami.io/no-use-{device_type}-uuid")
    }
}

/// Cambricon MLUs' names (HAMi `pkg/device/cambricon`).
pub mod cambricon {
    /// The device type MLUs are scheduled and handed off as (`MLU`).
    pub const DEVICE_TYPE: &str = "MLU";
    /// Comma list; only MLUs whose type contains one of the entries.
    pub const USE_MLU_TYPE: &str = "cambricon.com/use-mlutype";
    /// Comma list; MLUs whose type contains one of the entries are excluded.
    pub const NOUSE_MLU_TYPE: &str = "cambricon.com/nouse-mlutype";
    /// Comma list of MLU UUIDs; only these may be used.
    pub const USE_UUID: &str = "cambricon.com/use-gpuuuid";
    /// Comma list of MLU UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "cambricon.com/nouse-gpuuuid";
    /// The Node lock Cambricon's plugin reads: the RFC 3339 time it was taken.
    pub const DSMLU_LOCK: &str = "cambricon.com/dsmlu.lock";
    /// Pod annotation: `<index>_<cores>_<memory in 256 MiB>` of the MLU.
    pub const DSMLU_PROFILE: &str = "CAMBRICON_DSMLU_PROFILE";
    /// Pod annotation: `false` until the plugin has assigned the MLU, as HAMi
    /// spells it.
    pub const DSMLU_ASSIGNED: &str = "CAMBRICON_DSMLU_ASSIGNED";
    /// The same, as Cambricon's device plugin spells it and reads it to find
    /// the pod (`DsmluResourceAssigned` in Cambricon/cambricon-k8s-device-plugin
    /// `device-plugin/pkg/mlu/const.go`, v1.3.6 to v2.0.22).
    pub const DSMLU_ASSIGNED_BY_PLUGIN: &str = "CAMBRICON_DSMLU_ASSIGHED";
    /// MiB per unit of the memory resource (`cambricon.com/mlu.smlu.vmemory`).
    pub const MEMORY_UNIT_MIB: u64 = 256;
}

/// Moore Threads GPUs' names (HAMi `pkg/device/mthreads`).
pub mod mthreads {
    /// The device type Moore Threads GPUs are scheduled and handed off as.
    pub const DEVICE_TYPE: &str = "Mthreads";
    /// Comma list of GPU UUIDs; only these may be used (HAMi spells it `.ai`).
    pub const USE_UUID: &str = "mthreads.ai/use-gpuuuid";
    /// Comma list of GPU UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "mthreads.ai/nouse-gpuuuid";
    /// Pod annotation the plugin reads: the card indexes, comma-separated.
    pub const GPU_INDEX: &str = "mthreads.com/gpu-index";
    /// Pod annotation: the node the pod was placed on.
    pub const PREDICATE_NODE: &str = "mthreads.com/predicate-node";
    /// Pod annotation: when it was placed, Unix nanoseconds.
    pub const PREDICATE_TIME: &str = "mthreads.com/predicate-time";
    /// Pod annotation HAMi's webhook writes for more than one GPU: how many.
    pub const REQUEST_GPU_NUM: &str = "mthreads.com/request-gpu-num";
    /// Compute units of one card (`mthreads.com/sgpu-core` counts them).
    pub const CORES_PER_CARD: u32 = 16;
    /// MiB per unit of `mthreads.com/sgpu-memory`.
    pub const MEMORY_UNIT_MIB: u64 = 512;
    /// The memory sizes a container may ask for, in units.
    pub const MEMORY_SLICES: [u64; 7] = [2, 4, 8, 16, 32, 64, 96];
    /// A whole card's memory, in units (48 GiB).
    pub const WHOLE_CARD_UNITS: u64 = 96;
}

/// Enflame GCUs' names (HAMi `pkg/device/enflame`).
pub mod enflame {
    /// The device type of whole GCUs (`enflame.com/gcu`).
    pub const GCU_TYPE: &str = "GCU";
    /// The device type of GCUs cut into DRS partitions (HAMi's
    /// `EnflameVGCUDevice`).
    pub const DRS_TYPE: &str = "Enflame";
    /// The Node annotation Enflame's plugin lists its DRS devices and
    /// profiles in (JSON).
    pub const DRS_CAPACITY: &str = "enflame.com/gcu-drs-capacity";
    /// The DRS hand-off list (HAMi's `SupportDevices`).
    pub const DRS_ALLOCATED: &str = "hami.io/enflame-vgpu-devices-allocated";
    /// `false` until the plugin has served the pod.
    pub const ASSIGNED: &str = "enflame.com/gcu-assigned";
    /// Bind's time, Unix nanoseconds.
    pub const ASSIGNED_TIME: &str = "enflame.com/gcu-assigned-time";
    /// The first DRS container's device index.
    pub const ASSIGNED_INDEX: &str = "enflame.com/gcu-assigned-index";
    /// The same index, as HAMi writes it again.
    pub const ASSIGNED_ID: &str = "enflame.com/gcu-assigned-id";
    /// The first DRS container's device minor number.
    pub const ASSIGNED_MINOR: &str = "enflame.com/gcu-assigned-minor";
    /// The first DRS container's slices.
    pub const REQUEST_SIZE: &str = "enflame.com/gcu-request-size";
    /// Per container: `{allocated, request, profileID, profileName}`.
    pub const ASSIGNED_CONTAINERS: &str = "assigned-containers";
    /// The memory HAMi gives each whole GCU read from the Node's capacity:
    /// a placeholder (the plugin reports none), kept so that the hand-off
    /// reads as HAMi's.
    pub const GCU_MEMORY: u64 = 100;
    /// Comma list of GCU UUIDs; only these may be used.
    pub const USE_UUID: &str = "enflame.com/use-gpuuuid";
    /// Comma list of GCU UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "enflame.com/nouse-gpuuuid";
}

/// Kunlunxin XPUs' names (HAMi `pkg/device/kunlun`): whole XPUs
/// (`device.go`, type `kunlun`) and shared vXPUs (`vdevice.go`, type `XPU`).
pub mod kunlun {
    /// The device type of whole XPUs (`kunlunxin.com/xpu`).
    pub const XPU_TYPE: &str = "kunlun";
    /// The device type of vXPUs (`kunlunxin.com/vxpu`).
    pub const VXPU_TYPE: &str = "XPU";
    /// MiB of a whole XPU (HAMi's `KunlunMaxMemory`), and the largest vXPU.
    pub const XPU_MEMORY_MIB: u64 = 98304;
    /// The vXPU sizes below a whole XPU, MiB: memory rounds up to one.
    pub const VXPU_SIZES_MIB: [u64; 2] = [24576, 49152];
    /// How many XPUs a container may ask for at once (HAMi's `graghSelect`
    /// places no other count).
    pub const COUNTS: [u64; 4] = [1, 2, 4, 8];
    /// The vXPU plugin's register annotation (JSON).
    pub const REGISTER: &str = "hami.io/node-register-xpu";
    /// The vXPU plugin's handshake annotation.
    pub const HANDSHAKE: &str = "hami.io/node-handshake-xpu";
    /// Whole XPUs' hand-off list (HAMi's `SupportDevices`).
    pub const ALLOCATED: &str = "hami.io/kunlun-allocated";
    /// Whole XPUs' indexes for the plugin (comma list).
    pub const DEVICE_IDX: &str = "BAIDU_COM_DEVICE_IDX";
    /// Comma list of XPU UUIDs; only these may be used.
    pub const USE_UUID: &str = "hami.io/use-xpu-uuid";
    /// Comma list of XPU UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "hami.io/no-use-xpu-uuid";
    /// Kunlunxin's own spelling of [`USE_UUID`], read when that is absent.
    pub const BAIDU_USE_UUID: &str = "baidu.com/use-gpuuuid";
    /// Kunlunxin's own spelling of [`NOUSE_UUID`], read as well.
    pub const BAIDU_NOUSE_UUID: &str = "baidu.com/nouse-gpuuuid";
}

/// AWS Neuron devices' names (HAMi `pkg/device/awsneuron`).
pub mod neuron {
    /// The device type HAMi gives Neuron devices (`AWSNeuron`).
    pub const DEVICE_TYPE: &str = "AWSNeuron";
    /// NeuronCores per device HAMi splits core requests by (its cap: the
    /// plugin's hand-off names at most two cores per device).
    pub const MAX_CORES_PER_DEVICE: u32 = 2;
    /// The Node label whose value (`inf2.48xlarge`, `trn1.32xlarge`) picks
    /// the topology: Inferentia devices form a ring, Trainium ones blocks.
    pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
    /// Comma list of device UUIDs; only these may be used.
    pub const USE_UUID: &str = "aws.amazon.com/use-neuron-uuid";
    /// Comma list of device UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "aws.amazon.com/nouse-neuron-uuid";
    /// HAMi's hand-off list (`SupportDevices`).
    pub const ALLOCATED: &str = "hami.io/aws-neuron-devices-allocated";
    /// The device (or core) indexes the plugin hands out.
    pub const ASSIGNED_INDEX: &str = "AWS_NEURON_IDS";
    /// Bind's time, Unix nanoseconds.
    pub const PREDICATE_TIME: &str = "NEURON_ALLOC_TIME";
    /// The core resource name, when the indexes are cores.
    pub const RESOURCE_TYPE: &str = "NEURON_RESOURCE_TYPE";
    /// `false` until the plugin has served the pod.
    pub const ALLOCATED_FLAG: &str = "NEURON_ALLOCATED";
    /// The node the pod was placed on.
    pub const PREDICATE_NODE: &str = "aws.amazon.com/predicate-node";
}

/// AMD GPUs' names (HAMi `pkg/device/amd`, `docs/develop/amd-vgpu.md`).
pub mod amd {
    /// The Node annotation AMD's HAMi plugin registers its GPUs in (JSON).
    pub const REGISTER: &str = "hami.io/node-amd-register";
    /// What the hand-off annotations are named after
    /// (`hami.io/amd-devices-to-allocate`).
    pub const HANDOFF_WORD: &str = "amd";
    /// Comma list of card types (substrings); only these may be used.
    pub const USE_TYPE: &str = "amd.com/use-gputype";
    /// Comma list of card types (substrings) that must not be used.
    pub const NOUSE_TYPE: &str = "amd.com/nouse-gputype";
    /// Comma list of GPU UUIDs; only these may be used.
    pub const USE_UUID: &str = "amd.com/use-gpu-uuid";
    /// Comma list of GPU UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "amd.com/nouse-gpu-uuid";
}

/// Vastai's names (HAMi `pkg/device/vastai`): the plugin registers whole
/// cards, or each card's dies with the card (`AIC`) they sit on.
pub mod vastai {
    /// The Node annotation the plugin registers its devices in (JSON).
    pub const REGISTER: &str = "hami.io/node-va-register";
    /// The Node annotation HAMi's register handshake runs on.
    pub const HANDSHAKE: &str = "hami.io/node-handshake-va";
    /// The device type requests and hand-offs name (HAMi's `VastaiDevice`).
    pub const DEVICE_TYPE: &str = "Vastai";
    /// What the hand-off annotations are named after
    /// (`hami.io/Vastai-devices-to-allocate`).
    pub const HANDOFF_WORD: &str = "Vastai";
    /// Comma list of card types; HAMi declares it and filters nothing by it.
    pub const USE_TYPE: &str = "vastaitech.com/use-va";
    /// Comma list of card types; HAMi declares it and filters nothing by it.
    pub const NOUSE_TYPE: &str = "vastaitech.com/nouse-va";
    /// Comma list of device ids; only these may be used.
    pub const USE_UUID: &str = "vastaitech.com/use-gpuuuid";
    /// Comma list of device ids that must not be used.
    pub const NOUSE_UUID: &str = "vastaitech.com/nouse-gpuuuid";
    /// The register's `custominfo` key saying how the plugin splits cards
    /// (`die`: one device per die).
    pub const STRATEGY_KEY: &str = "DeviceStrategy";
    /// [`STRATEGY_KEY`]'s value for devices registered die by die.
    pub const DIE_STRATEGY: &str = "die";
    /// The register's `custominfo` key naming the card a die sits on.
    pub const CARD_KEY: &str = "AIC";
}

/// Biren's names (HAMi `pkg/device/biren`, Project-HAMi/biren-device-plugin).
pub mod biren {
    /// The Node annotation the plugin registers its GPUs in (JSON).
    pub const REGISTER: &str = "hami.io/node-biren-register";
    /// The Node annotation HAMi's register handshake runs on.
    pub const HANDSHAKE: &str = "hami.io/node-handshake-biren";
    /// The device type requests and hand-offs name (HAMi's `BirenDevice`).
    pub const DEVICE_TYPE: &str = "Biren";
    /// What the hand-off annotations are named after
    /// (`hami.io/Biren-devices-allocated`, which the plugin reads).
    pub const HANDOFF_WORD: &str = "Biren";
    /// Comma list of card types; HAMi declares it and filters nothing by it.
    pub const USE_TYPE: &str = "birentech.com/use-biren";
    /// Comma list of card types; HAMi declares it and filters nothing by it.
    pub const NOUSE_TYPE: &str = "birentech.com/nouse-biren";
    /// Comma list of GPU ids; only these may be used.
    pub const USE_UUID: &str = "birentech.com/use-gpuuuid";
    /// Comma list of GPU ids that must not be used.
    pub const NOUSE_UUID: &str = "birentech.com/nouse-gpuuuid";
}

/// MetaX GPUs' names (HAMi `pkg/device/metax`): whole GPUs (`Metax-GPU`)
/// and shared sGPUs (`Metax-SGPU`).
pub mod metax {
    /// The device type of whole GPUs (`metax-tech.com/gpu`).
    pub const GPU_TYPE: &str = "Metax-GPU";
    /// The device type of shared GPUs (`metax-tech.com/sgpu`).
    pub const SGPU_TYPE: &str = "Metax-SGPU";
    /// MiB HAMi gives each whole GPU read from the Node's capacity.
    pub const GPU_MEMORY_MIB: u64 = 65_536;
    /// MiB per unit of a bare `metax-tech.com/vmemory` number (GiB).
    pub const VMEMORY_UNIT_MIB: u64 = 1024;
    /// Node annotation: the sGPU plugin's devices (a JSON list).
    pub const NODE_DEVICES: &str = "metax-tech.com/node-gpu-devices";
    /// Pod annotation the sGPU plugin reads: per container, the sGPUs with
    /// their compute and memory (JSON).
    pub const ALLOCATED: &str = "metax-tech.com/gpu-devices-allocated";
    /// Pod annotation: when the pod was placed, Unix nanoseconds.
    pub const PREDICATE_TIME: &str = "metax-tech.com/predicate-time";
    /// Comma list of sGPU UUIDs; only these may be used.
    pub const USE_UUID: &str = "metax-tech.com/use-gpuuuid";
    /// Comma list of sGPU UUIDs that must not be used.
    pub const NOUSE_UUID: &str = "metax-tech.com/nouse-gpuuuid";
    /// Pod annotation: how the sGPU shares compute (`best-effort`,
    /// `fixed-share`, `burst-share`); the webhook writes `best-effort`
    /// when absent.
    pub const QOS_POLICY: &str = "metax-tech.com/sgpu-qos-policy";
    /// The QoS policies a pod may name.
    pub const QOS_POLICIES: [&str; 3] = ["best-effort", "fixed-share", "burst-share"];
    /// Pod annotation: `online` or `offline` (co-location classes).
    pub const APP_CLASS: &str = "metax-tech.com/sgpu-app-class";
    /// Pod annotation: whether an exclusive pod prefers GPUs on one MetaLink.
    pub const TOPOLOGY_AWARE: &str = "metax-tech.com/sgpu-topology-aware";
    /// Node annotation of MetaX's GPU plugin: per number of whole GPUs a pod
    /// takes, the topology it loses (JSON `{"1": 0, "2": 10}`).
    pub const TOPOLOGY_LOSSES: &str = "metax-tech.com/gpu.topology.losses";
    /// Node annotation of MetaX's GPU plugin: per number of whole GPUs a pod
    /// takes, how good taking them is (JSON, as the losses).
    pub const TOPOLOGY_SCORES: &str = "metax-tech.com/gpu.topology.scores";
}

/// Iluvatar GPUs' names (HAMi `pkg/device/iluvatar`).
pub mod iluvatar {
    /// MiB per unit of an Iluvatar memory resource (`iluvatar.ai/<chip>.vMem`).
    pub const MEMORY_UNIT_MIB: u64 = 256;
    /// The variable HAMi's webhook gives each Iluvatar container: its name,
    /// which the vendor's runtime reads (HAMi keeps the misspelling).
    pub const CONTAINER_NAME_ENV: &str = "SOL_CONTINER_NAME";
}

/// The field manager the node agent writes its GpuNode's status as: on a
/// node where another vendor's plugin also serves devices, the controller
/// tells the agent's GpuNode by it and adds the vendor's devices beside the
/// agent's, under its own field manager.
pub const NODE_AGENT_FIELD_MANAGER: &str = "tessera-node-agent";

/// HAMi's hand-off between the scheduler and a device plugin, on the pod
/// (and the node's lock): every family's Bind writes these, plugins and
/// the lifecycle controllers read them. Tenants may not set them
/// (`controllers/src/webhook/owned.rs`).
pub mod handoff {
    /// The node a pod was placed on (HAMi's `AssignedNodeAnnotations`).
    pub const VGPU_NODE: &str = "hami.io/vgpu-node";
    /// When it was placed, Unix seconds.
    pub const VGPU_TIME: &str = "hami.io/vgpu-time";
    /// When Bind ran, Unix seconds.
    pub const BIND_TIME: &str = "hami.io/bind-time";
    /// `allocating` from Bind until the plugin says `success` or `failed`.
    pub const BIND_PHASE: &str = "hami.io/bind-phase";
    /// The Node annotation a plugin deletes when it has served the pod:
    /// `<RFC 3339 time>,<namespace>,<pod>`.
    pub const MUTEX_LOCK: &str = "hami.io/mutex.lock";
}

/// Annotations Tessera writes on Nodes.
pub mod node_annotations {
    /// The node agent's readiness for GPU pods (`True` or `False: <reason>`),
    /// mirrored from its GpuNode's `Ready` condition. kube-scheduler does not
    /// watch GpuNodes; a change here is a Node event, so pods the extender
    /// turned away from a node that was not ready are retried at once.
    pub const GPU_READY: &str = "tessera.dev/gpu-ready";
}

/// How NVIDIA spells a GPU's 16-byte UUID (NVML, `nvidia-smi`, the device
/// plugin's device IDs): `GPU-` and the bytes as lowercase hex in the
/// groups 8-4-4-4-12.
pub fn gpu_uuid_string(bytes: &[u8; 16]) -> String {
    let mut text = String::with_capacity(40);
    text.push_str("GPU-");
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        text.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_gpu_uuid_is_spelled_as_nvidia_does() {
        let bytes = [
            0x7e, 0x55, 0xe4, 0xa0, 0xfa, 0x4e, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0x12, 0xab,
        ];
        assert_eq!(
            super::gpu_uuid_string(&bytes),
            "GPU-7e55e4a0-fa4e-4000-8000-0000000012ab"
        );
    }
}
