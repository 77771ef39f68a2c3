//! A mock of another vendor's device plugin, speaking HAMi's protocol as the
//! real plugins do, for nodes without the vendor's hardware:
//!
//! - **Register** (Project-HAMi/ascend-device-plugin `internal/server/register.go`
//!   `registerHAMi`; dcu-vgpu-device-plugin `internal/pkg/api/device_register.go`):
//!   every `interval` it writes the Node's register annotation (Ascend:
//!   JSON `hami.io/node-register-<chip>` with `custominfo.NetworkID`, and
//!   `hami-vnpu-core: "false"`; Hygon: CSV `hami.io/node-dcu-register`) and
//!   answers the handshake with `Reported_<time>`.
//! - **Kubelet device plugin** (`v1beta1`, the real kubelet): registers the
//!   vendor's count resource (`huawei.com/<chip>`, `hygon.com/dcunum`) with
//!   `count` replicas of each device, as those plugins advertise them.
//! - **Allocate** (ascend-device-plugin `internal/server/server.go` `Allocate`
//!   and `allocate.go`; HAMi `pkg/util/util.go` `GetPendingPod`,
//!   `pkg/device-plugin/.../plugin/util.go` `PodAllocationTrySuccess`):
//!   finds the pod through the Node's `hami.io/mutex.lock` (else the pending
//!   pod with `hami.io/vgpu-node` and `bind-phase`), takes the next
//!   container's devices from `hami.io/<x>-devices-to-allocate`, refuses a
//!   count that differs from the kubelet's, answers with the vendor's
//!   variables, writes the erased annotation back, and once no container is
//!   left sets `bind-phase: success` and deletes the lock (`failed` on error).
//!
//! - **Iluvatar** (HAMi `pkg/device/iluvatar`): CSV
//!   `hami.io/node-<chip>-register` with the handshake
//!   `hami.io/node-handshake-<chip>`, as Hygon's; devices from
//!   `hami.io/<chip>-devices-to-allocate`.
//! - **Kunlunxin vXPUs** (HAMi `pkg/device/kunlun/vdevice.go`): JSON
//!   `hami.io/node-register-xpu` with the handshake
//!   `hami.io/node-handshake-xpu`; devices from
//!   `hami.io/xpu-devices-to-allocate`.
//! - **MetaX sGPUs** (HAMi `pkg/device/metax/sdevice.go`): JSON
//!   `metax-tech.com/node-gpu-devices` (`MetaxSDeviceInfo`), no handshake;
//!   at Allocate the container's sGPUs are read from MetaX's own
//!   `metax-tech.com/gpu-devices-allocated` (one list per container) and
//!   must agree with HAMi's `hami.io/metax-sgpu-devices-to-allocate`.
//! - **AMD** (Project-HAMi/amd-device-plugin `internal/pkg/plugin/plugin.go`
//!   `RegisterInAnnotation`, `Allocate`, `buildCUAllocations`,
//!   `validateNodeLockOwner`; `internal/pkg/cuallocation`): JSON
//!   `hami.io/node-amd-register` without a handshake; at Allocate the
//!   compute units are taken first-fit from those the node's pods hold
//!   (`hami.io/amd-cu-allocated`, refused when two pods' overlap), the
//!   Node lock must name the pod, and the pod's CUs are written back.
//!
//! - **Cambricon** (dynamic-smlu, Cambricon's public plugin):
//!   [`cambricon`]. **Enflame DRS** (gcushare, public): [`enflame`].
//! - **Whole Enflame GCUs and whole MetaX GPUs** (closed plugins): the
//!   count resource only, the pod by HAMi's `GetPendingPod` (they take no
//!   lock), devices from `hami.io/{enflame-gcu,metax-gpu}-devices-to-allocate`
//!   by the index in HAMi's `<node>-<infix>-<index>` names.
//! - **Moore Threads, AWS Neuron, whole Kunlunxin XPUs** (closed plugins):
//!   [`indexed`].
//!
//! Plugins that report only through the Node's capacity register several
//! resources, each on its own socket ([`MockPlugin::registrations`]).
//!
//! What the real plugins hand the container and the mock cannot (device
//! nodes, driver mounts, the vNPU itself) becomes variables: Ascend's own
//! `ASCEND_VISIBLE_DEVICES` and `ASCEND_VNPU_SPECS`; for Hygon, whose
//! plugin passes `/dev/dri` nodes and a vdev file, `HIP_VISIBLE_DEVICES`
//! and `TESSERA_MOCK_DCU_VDEV` (`<uuid>:<MiB>:<cores>` per DCU); AMD's own
//! `ROCR_VISIBLE_DEVICES` (the device ids where the plugin puts ROCr
//! UUIDs), `HSA_CU_MASK` and `HIP_DEVICE_MEMORY_LIMIT`; for Iluvatar,
//! whose plugin is closed, `TESSERA_MOCK_IX_VDEV` (`<uuid>:<MiB>:<cores>`);
//! for Kunlunxin, Kunlun's own `XPU_VISIBLE_DEVICES` and
//! `TESSERA_MOCK_XPU_VDEV` (`<uuid>:<MiB>`); for MetaX `TESSERA_MOCK_SGPU`
//! (`<uuid>:<vRam>:<compute>` from MetaX's list); for whole MetaX GPUs,
//! whose plugin's variable is not public, `TESSERA_MOCK_METAX_GPUS`.

mod amd;
pub mod cambricon;
pub mod enflame;
mod fleet;
mod hami;
pub mod indexed;
mod plugin;
mod pods;
mod protocol;
mod service;
mod types;

pub use amd::AllocateState;
pub use fleet::{
    amd_mi300x, ascend_910b4, biren_gpus, cambricon_mlu370, chart_values, enflame_gcus,
    enflame_s60, hygon_dcus, iluvatar_mr_v100, kunlunxin_whole_xpus, kunlunxin_xpus, metax_c500,
    metax_gpus, mthreads_s4000, neuron_devices, vastai_dies,
};
pub use plugin::MockPlugin;
pub use protocol::{
    Handed, all_served, cu_list, decode, encode, first_free_cus, parse_cu_list, pop_next,
};
pub use types::{MockDevice, Registration, Vendor};
