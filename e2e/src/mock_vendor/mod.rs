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
//! (`<uuid>:<vRam>:<compute>` from MetaX's list).

mod amd;
pub mod cambricon;
pub mod enflame;
pub mod indexed;
mod protocol;
mod service;

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::{Timestamp, tz::TimeZone},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use amd::AllocateState;
pub use protocol::{
    Handed, all_served, cu_list, decode, encode, first_free_cus, parse_cu_list, pop_next,
};

use crate::Error;

/// Chart values that turn on the families the mocks play, as a HAMi user
/// copies them from `hami-scheduler-device`: `hygon: {}`, `amd: {}`,
/// `kunlun: {}`, `metax: {}`, `cambricon: {}`, `enflame: {}`, `mthreads: {}`
/// and `awsneuron: {}` (HAMi's names), an `iluvatars:` entry for
/// the MR-V100, and HAMi's `vnpus:` entry for the Ascend 910B4 with its two
/// templates.
pub fn chart_values() -> serde_json::Value {
    json!({"config": {
        "hygon": {},
        "amd": {},
        "kunlun": {},
        "metax": {},
        "cambricon": {},
        "enflame": {},
        "mthreads": {},
        "awsneuron": {},
        "iluvatars": [{
            "chipName": "MR-V100", "commonWord": "MR-V100",
            "resourceCountName": "iluvatar.ai/MR-V100-vgpu",
            "resourceMemoryName": "iluvatar.ai/MR-V100.vMem",
            "resourceCoreName": "iluvatar.ai/MR-V100.vCore",
        }],
        "vnpus": {"hamiVnpuCore": false, "configs": [{
            "chipName": "910B4", "commonWord": "Ascend910B4",
            "resourceName": "huawei.com/Ascend910B4",
            "resourceMemoryName": "huawei.com/Ascend910B4-memory",
            "resourceCoreName": "huawei.com/Ascend910B4-core",
            "memoryAllocatable": 32768, "memoryCapacity": 32768, "aiCore": 20, "aiCPU": 7,
            "templates": [
                {"name": "vir05_1c_8g", "memory": 8192, "aiCore": 5, "aiCPU": 1},
                {"name": "vir10_3c_16g", "memory": 16384, "aiCore": 10, "aiCPU": 3},
            ],
        }]},
    }})
}

/// `n` devices `<prefix>-<i>` of `memory_mib` and `cores`, 4 shares each,
/// on `network_id`.
fn devices(
    n: u32,
    prefix: &str,
    memory_mib: u64,
    cores: u32,
    network_id: Option<u32>,
) -> Vec<MockDevice> {
    (0..n)
        .map(|i| MockDevice {
            id: format!("{prefix}-{i}"),
            memory_mib,
            cores,
            count: 4,
            network_id,
        })
        .collect()
}

/// `n` Ascend 910B4 NPUs of 32 GiB (20 AI cores) on one network, 4 shares
/// each.
pub fn ascend_910b4(n: u32) -> Vec<MockDevice> {
    devices(n, "NPU", 32768, 20, Some(0))
}

/// `n` AMD Instinct MI300X VF GPUs of 192 GiB and 304 compute units, 4
/// shares each.
pub fn amd_mi300x(n: u32) -> Vec<MockDevice> {
    devices(n, "AMD-MI300X", 196_608, 304, None)
}

/// `n` Hygon DCUs of 16 GiB, 4 shares each.
pub fn hygon_dcus(n: u32) -> Vec<MockDevice> {
    devices(n, "DCU", 16384, 100, None)
}

/// `n` Iluvatar MR-V100 GPUs of 32 GiB, 4 shares each.
pub fn iluvatar_mr_v100(n: u32) -> Vec<MockDevice> {
    devices(n, "MR-V100", 32768, 100, None)
}

/// `n` MetaX C500 GPUs of 64 GiB, 4 sGPUs each.
pub fn metax_c500(n: u32) -> Vec<MockDevice> {
    devices(n, "MX-C500", 65_536, 100, None)
}

/// `n` Cambricon MLU370 cards of 16 GiB.
pub fn cambricon_mlu370(n: u32) -> Vec<MockDevice> {
    devices(n, "MLU370", 16384, 100, None)
}

/// `n` Enflame S60 GCUs of 48 GiB, 6 DRS slices each.
pub fn enflame_s60(n: u32) -> Vec<MockDevice> {
    devices(n, "GCU", 49152, 100, None)
}

/// `devices`, each for one container at a time (a whole card).
fn whole(mut devices: Vec<MockDevice>) -> Vec<MockDevice> {
    for d in &mut devices {
        d.count = 1;
    }
    devices
}

/// `n` whole Enflame GCUs.
pub fn enflame_gcus(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "GCU", 49152, 100, None))
}

/// `n` whole MetaX GPUs of 64 GiB.
pub fn metax_gpus(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "MX-GPU", 65_536, 100, None))
}

/// `n` whole Kunlunxin XPUs of 96 GiB.
pub fn kunlunxin_whole_xpus(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "XPU", 98_304, 100, None))
}

/// `n` Moore Threads MTT S4000 GPUs of 48 GiB (96 units of 512 MiB), 16
/// core groups and 4 vGPUs each.
pub fn mthreads_s4000(n: u32) -> Vec<MockDevice> {
    devices(n, "MTT-S4000", 49_152, 16, None)
}

/// `n` AWS Neuron devices of 2 NeuronCores each.
pub fn neuron_devices(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "NEURON", 0, 2, None))
}

/// `n` Kunlunxin P800 XPUs of 96 GiB, 4 vXPUs each.
pub fn kunlunxin_xpus(n: u32) -> Vec<MockDevice> {
    devices(n, "XPU", 98_304, 100, None)
}

/// `Reported_<time>`, a plugin's answer to the scheduler's handshake.
fn reported(time: &k8s_openapi::jiff::Zoned) -> String {
    format!("Reported_{}", time.strftime("%Y-%m-%d %H:%M:%S"))
}

/// `<uuid>:<MiB>[:<cores>]` per device, comma-separated.
fn vdev(devices: &[Handed], cores: bool) -> String {
    let each: Vec<String> = devices
        .iter()
        .map(|d| {
            if cores {
                format!("{}:{}:{}", d.uuid, d.memory_mib, d.cores)
            } else {
                format!("{}:{}", d.uuid, d.memory_mib)
            }
        })
        .collect();
    each.join(",")
}

/// The container's sGPUs as MetaX's plugin reads them: the list in
/// `metax-tech.com/gpu-devices-allocated` whose UUIDs are `devices`', as
/// `<uuid>:<vRam>:<compute>`.
fn metax_sgpus(
    devices: &[Handed],
    annotations: &BTreeMap<String, String>,
) -> Result<String, String> {
    const KEY: &str = "metax-tech.com/gpu-devices-allocated";
    let lists: Vec<Vec<serde_json::Value>> = annotations
        .get(KEY)
        .map(|v| serde_json::from_str(v))
        .transpose()
        .map_err(|e| format!("annotation {KEY} invalid: {e}"))?
        .ok_or_else(|| format!("annotation {KEY} not set"))?;
    let wanted: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    let list = lists
        .iter()
        .find(|list| {
            list.iter()
                .map(|d| d["uuid"].as_str().unwrap_or_default())
                .eq(wanted.iter().copied())
        })
        .ok_or_else(|| format!("annotation {KEY} lists no container with sGPUs {wanted:?}"))?;
    let each: Vec<String> = list
        .iter()
        .map(|d| {
            format!(
                "{}:{}:{}",
                d["uuid"].as_str().unwrap_or_default(),
                d["vRam"].as_u64().unwrap_or(0),
                d["compute"].as_u64().unwrap_or(0)
            )
        })
        .collect();
    Ok(each.join(","))
}

/// The node's pending pods (`spec.nodeName`, `status.phase=Pending`), as
/// the plugins that find their pod themselves list them.
pub(crate) async fn pending_on(client: &Client, node: &str) -> Result<Vec<Pod>, String> {
    let selector = format!("spec.nodeName={node},status.phase=Pending");
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items)
        .map_err(|e| format!("failed to get pending pods assigned to node {node}: {e}"))
}

/// Which vendor the mock plays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// Hygon DCUs, as HAMi's dcu-vgpu-device-plugin.
    Hygon,
    /// Ascend NPUs of one chip (`Ascend910B4`), as HAMi's ascend-device-plugin.
    Ascend {
        /// The chip's `commonWord`.
        chip: String,
    },
    /// AMD Instinct GPUs of one product, as HAMi's amd-device-plugin.
    Amd {
        /// The product type the plugin registers (`AMD Instinct MI300X VF`).
        product: String,
    },
    /// Iluvatar GPUs of one chip (`MR-V100`), as HAMi expects Iluvatar's
    /// plugin to behave.
    Iluvatar {
        /// The chip's `commonWord`.
        chip: String,
    },
    /// Kunlunxin vXPUs, as Kunlunxin's vxpu-device-plugin.
    Kunlunxin,
    /// MetaX sGPUs, as MetaX's sGPU device plugin.
    Metax,
    /// Cambricon MLUs in dynamic-smlu mode, as Cambricon's device plugin.
    Cambricon,
    /// Enflame GCUs cut into DRS partitions, as Enflame's gcushare plugin.
    EnflameDrs,
    /// Whole Enflame GCUs, as HAMi expects Enflame's `gcu-k8s-device-plugin`.
    EnflameGcu,
    /// Whole MetaX GPUs, as HAMi expects MetaX's `gpu-device` plugin.
    MetaxGpu,
    /// Whole Kunlunxin XPUs, as HAMi expects Kunlunxin's plugin.
    KunlunxinXpu,
    /// Moore Threads GPUs, as HAMi expects Moore Threads' plugin.
    Mthreads,
    /// AWS Neuron devices, as HAMi expects AWS's `neuron-device-plugin`.
    Neuron {
        /// The node's `node.kubernetes.io/instance-type` (`inf2.48xlarge`).
        instance_type: String,
    },
}

impl Vendor {
    /// The family's name (the node's `accelerator` label in the tests).
    pub fn family(&self) -> &'static str {
        match self {
            Vendor::Hygon => "hygon",
            Vendor::Ascend { .. } => "ascend",
            Vendor::Amd { .. } => "amd",
            Vendor::Iluvatar { .. } => "iluvatar",
            Vendor::Kunlunxin => "kunlunxin",
            Vendor::Metax => "metax",
            Vendor::Cambricon => "cambricon",
            Vendor::EnflameDrs | Vendor::EnflameGcu => "enflame",
            Vendor::MetaxGpu => "metax",
            Vendor::KunlunxinXpu => "kunlunxin",
            Vendor::Mthreads => "mthreads",
            Vendor::Neuron { .. } => "awsneuron",
        }
    }

    /// The labels of the vendor's Node: `accelerator: <family>`, and for
    /// AWS Neuron the instance type the cloud provider sets.
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([("accelerator".to_owned(), self.family().to_owned())]);
        if let Vendor::Neuron { instance_type } = self {
            labels.insert(
                tessera_api::names::neuron::INSTANCE_TYPE_LABEL.to_owned(),
                instance_type.clone(),
            );
        }
        labels
    }
}

/// One resource the mock registers with the kubelet, on its own socket (a
/// plugin reporting through the Node's allocatable registers several).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The resource name.
    pub resource: String,
    /// The socket's file name in the kubelet's device-plugin directory.
    pub socket: String,
    /// The device IDs it advertises.
    pub devices: Vec<String>,
}

/// One device the mock registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MockDevice {
    /// Its UUID.
    pub id: String,
    /// MiB.
    pub memory_mib: u64,
    /// Compute as the vendor counts it (percent; AI cores for Ascend;
    /// compute units for AMD).
    pub cores: u32,
    /// How many containers may share it.
    pub count: u32,
    /// Ascend's `NetworkID`.
    pub network_id: Option<u32>,
}

/// A mock plugin for one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MockPlugin {
    /// The vendor.
    pub vendor: Vendor,
    /// The Node it runs on.
    pub node: String,
    /// Its devices, in index order.
    pub devices: Vec<MockDevice>,
    /// The kubelet's device-plugin directory (where `kubelet.sock` is).
    pub plugin_dir: PathBuf,
    /// How often the register annotation is written (HAMi's plugins: 30 s).
    pub interval: Duration,
}

impl MockPlugin {
    /// The resource the kubelet advertises the devices as.
    pub fn resource(&self) -> String {
        match &self.vendor {
            Vendor::Hygon => "hygon.com/dcunum".into(),
            Vendor::Ascend { chip } => format!("huawei.com/{chip}"),
            Vendor::Amd { .. } => "amd.com/gpu".into(),
            Vendor::Iluvatar { chip } => format!("iluvatar.ai/{chip}-vgpu"),
            Vendor::Kunlunxin => "kunlunxin.com/vxpu".into(),
            Vendor::Metax => "metax-tech.com/sgpu".into(),
            Vendor::Cambricon => cambricon::VCORE.into(),
            Vendor::EnflameDrs => enflame::DRS_GCU.into(),
            Vendor::EnflameGcu => "enflame.com/gcu".into(),
            Vendor::MetaxGpu => "metax-tech.com/gpu".into(),
            Vendor::KunlunxinXpu => indexed::XPU.into(),
            Vendor::Mthreads => indexed::MT_VGPU.into(),
            Vendor::Neuron { .. } => indexed::NEURON.into(),
        }
    }

    /// What the mock registers with the kubelet: HAMi's plugins one count
    /// resource with `count` replicas of each device; Cambricon's three
    /// (`cambricon::registrations`).
    pub fn registrations(&self) -> Vec<Registration> {
        match &self.vendor {
            Vendor::Cambricon => cambricon::registrations(&self.devices),
            Vendor::EnflameDrs => vec![enflame::registration(&self.devices)],
            Vendor::Mthreads => indexed::mthreads(&self.devices),
            Vendor::Neuron { .. } => indexed::neuron(&self.devices),
            Vendor::KunlunxinXpu => indexed::kunlunxin(&self.devices),
            _ => vec![Registration {
                resource: self.resource(),
                socket: self.socket_name(),
                devices: self
                    .devices
                    .iter()
                    .flat_map(|d| (0..d.count).map(move |k| format!("{}-{k}", d.id)))
                    .collect(),
            }],
        }
    }

    /// The device type in HAMi's pod annotations.
    pub fn device_type(&self) -> &str {
        match &self.vendor {
            Vendor::Hygon => "DCU",
            Vendor::Ascend { chip } => chip,
            Vendor::Amd { product } => product,
            Vendor::Iluvatar { chip } => chip,
            Vendor::Kunlunxin => "XPU",
            Vendor::Metax => "Metax-SGPU",
            Vendor::Cambricon => "MLU",
            Vendor::EnflameDrs => "Enflame",
            Vendor::EnflameGcu => "GCU",
            Vendor::MetaxGpu => "Metax-GPU",
            Vendor::KunlunxinXpu => "kunlun",
            Vendor::Mthreads => "Mthreads",
            Vendor::Neuron { .. } => "AWSNeuron",
        }
    }

    /// The pod annotation the plugin reads its devices from.
    pub fn to_allocate(&self) -> String {
        match &self.vendor {
            Vendor::Hygon => "hami.io/dcu-devices-to-allocate".into(),
            Vendor::Ascend { chip } => format!("hami.io/{chip}-devices-to-allocate"),
            Vendor::Amd { .. } => "hami.io/amd-devices-to-allocate".into(),
            Vendor::Iluvatar { chip } => format!("hami.io/{chip}-devices-to-allocate"),
            Vendor::Kunlunxin => "hami.io/xpu-devices-to-allocate".into(),
            Vendor::Metax => "hami.io/metax-sgpu-devices-to-allocate".into(),
            Vendor::Cambricon => "hami.io/cambricon-mlu-devices-to-allocate".into(),
            Vendor::EnflameDrs => "hami.io/enflame-vgpu-devices-to-allocate".into(),
            Vendor::EnflameGcu => "hami.io/enflame-gcu-devices-to-allocate".into(),
            Vendor::MetaxGpu => "hami.io/metax-gpu-devices-to-allocate".into(),
            Vendor::KunlunxinXpu => "hami.io/kunlun-allocated".into(),
            Vendor::Mthreads => "hami.io/mthreads-vgpu-devices-to-allocate".into(),
            Vendor::Neuron { .. } => "hami.io/aws-neuron-devices-allocated".into(),
        }
    }

    fn socket_name(&self) -> String {
        match &self.vendor {
            Vendor::Hygon => "mock-hygon.sock".into(),
            Vendor::Ascend { chip } => format!("mock-{}.sock", chip.to_lowercase()),
            Vendor::Amd { .. } => "mock-amd.sock".into(),
            Vendor::Iluvatar { chip } => format!("mock-{}.sock", chip.to_lowercase()),
            Vendor::Kunlunxin => "mock-kunlunxin.sock".into(),
            Vendor::Metax => "mock-metax.sock".into(),
            Vendor::Cambricon => "mock-cambricon.sock".into(),
            Vendor::EnflameDrs => "mock-enflame.sock".into(),
            Vendor::EnflameGcu => "mock-enflame-gcu.sock".into(),
            Vendor::MetaxGpu => "mock-metax-gpu.sock".into(),
            Vendor::KunlunxinXpu => "mock-kunlunxin-xpu.sock".into(),
            Vendor::Mthreads => "mock-mthreads.sock".into(),
            Vendor::Neuron { .. } => "mock-neuron.sock".into(),
        }
    }

    /// The Node annotations one register pass writes at `now`.
    pub fn register_annotations(&self, now: Timestamp) -> BTreeMap<String, String> {
        let time = now.to_zoned(TimeZone::UTC);
        let mut out = BTreeMap::new();
        match &self.vendor {
            Vendor::Hygon => {
                out.insert("hami.io/node-dcu-register".into(), self.csv("DCU-Z100"));
                out.insert("hami.io/node-handshake-dcu".into(), reported(&time));
            }
            Vendor::Iluvatar { chip } => {
                out.insert(format!("hami.io/node-{chip}-register"), self.csv(chip));
                out.insert(format!("hami.io/node-handshake-{chip}"), reported(&time));
            }
            Vendor::Ascend { chip } => {
                let devices: Vec<_> = self
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        let mut device = json!({"index": i, "id": d.id, "count": d.count,
                            "devmem": d.memory_mib, "devcore": d.cores, "type": chip, "health": true});
                        if let Some(network) = d.network_id {
                            device["custominfo"] = json!({"NetworkID": network});
                        }
                        device
                    })
                    .collect();
                out.insert(
                    format!("hami.io/node-register-{chip}"),
                    serde_json::Value::from(devices).to_string(),
                );
                out.insert(
                    format!("hami.io/node-handshake-{chip}"),
                    format!("Reported_{}", time.strftime("%Y.%m.%d %H:%M:%S")),
                );
                out.insert("hami-vnpu-core".into(), "false".into());
            }
            Vendor::Amd { product } => {
                out.insert(
                    "hami.io/node-amd-register".into(),
                    self.device_info(product, "amd"),
                );
            }
            Vendor::Kunlunxin => {
                out.insert(
                    "hami.io/node-register-xpu".into(),
                    self.device_info("XPU", "XPU"),
                );
                out.insert("hami.io/node-handshake-xpu".into(), reported(&time));
            }
            Vendor::Metax => {
                // MetaX's `MetaxSDeviceInfo`, one per GPU.
                let devices: Vec<_> = self
                    .devices
                    .iter()
                    .map(|d| {
                        json!({"uuid": d.id, "totalDevCount": d.count, "totalCompute": d.cores,
                            "totalVRam": d.memory_mib, "numa": 0, "healthy": true,
                            "linkZone": 0, "qosPolicy": "best-effort"})
                    })
                    .collect();
                out.insert(
                    "metax-tech.com/node-gpu-devices".into(),
                    serde_json::Value::from(devices).to_string(),
                );
            }
            // Report only through the Node's allocatable.
            Vendor::Cambricon
            | Vendor::EnflameGcu
            | Vendor::MetaxGpu
            | Vendor::KunlunxinXpu
            | Vendor::Mthreads
            | Vendor::Neuron { .. } => {}
            Vendor::EnflameDrs => {
                let (key, value) = enflame::capacity_annotation(&self.devices);
                out.insert(key, value);
            }
        }
        out
    }

    /// HAMi's CSV register form, one `id,count,devmem,devcore,type,numa,health,index,mode:`
    /// per device.
    fn csv(&self, device_type: &str) -> String {
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                format!(
                    "{},{},{},{},{device_type},0,true,{i},hami-core:",
                    d.id, d.count, d.memory_mib, d.cores
                )
            })
            .collect()
    }

    /// HAMi's `DeviceInfo` JSON, as `marshalNodeDevices` writes it.
    fn device_info(&self, device_type: &str, vendor: &str) -> String {
        let devices: Vec<_> = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                json!({"id": d.id, "index": i, "count": d.count, "devmem": d.memory_mib,
                    "devcore": d.cores, "type": device_type, "numa": 0, "mode": "",
                    "health": true, "devicevendor": vendor})
            })
            .collect();
        serde_json::Value::from(devices).to_string()
    }

    /// The variables a container gets for `devices` of pod `annotations`;
    /// `state` carries what one Allocate call decides across containers
    /// (AMD's compute units).
    pub fn env(
        &self,
        devices: &[Handed],
        annotations: &BTreeMap<String, String>,
        state: &mut AllocateState,
    ) -> Result<BTreeMap<String, String>, String> {
        // A plugin read through the Node's capacity knows its devices by
        // HAMi's names, `<node>-<infix>-<index>`.
        let by_capacity = matches!(self.vendor, Vendor::EnflameGcu | Vendor::MetaxGpu);
        let index = |uuid: &str| {
            let position = if by_capacity {
                uuid.strip_prefix(&format!("{}-", self.node))
                    .and_then(|rest| rest.rsplit_once('-'))
                    .and_then(|(_, i)| i.parse::<usize>().ok())
                    .filter(|i| *i < self.devices.len())
            } else {
                self.devices.iter().position(|d| d.id == uuid)
            };
            position.ok_or_else(|| format!("unknown uuid: {uuid}"))
        };
        let indexes = devices
            .iter()
            .map(|d| index(&d.uuid).map(|i| i.to_string()))
            .collect::<Result<Vec<_>, _>>()?
            .join(",");
        let mut env = BTreeMap::new();
        match &self.vendor {
            Vendor::Hygon => {
                env.insert("HIP_VISIBLE_DEVICES".into(), indexes);
                env.insert("TESSERA_MOCK_DCU_VDEV".into(), vdev(devices, true));
            }
            Vendor::Iluvatar { .. } => {
                env.insert("TESSERA_MOCK_IX_VDEV".into(), vdev(devices, true));
            }
            Vendor::Kunlunxin => {
                env.insert("XPU_VISIBLE_DEVICES".into(), indexes);
                env.insert("TESSERA_MOCK_XPU_VDEV".into(), vdev(devices, false));
            }
            Vendor::Metax => {
                env.insert(
                    "TESSERA_MOCK_SGPU".into(),
                    metax_sgpus(devices, annotations)?,
                );
            }
            Vendor::Ascend { chip } => {
                env.insert("ASCEND_VISIBLE_DEVICES".into(), indexes);
                let key = format!("huawei.com/{chip}");
                let info: Vec<serde_json::Value> = annotations
                    .get(&key)
                    .map(|v| serde_json::from_str(v))
                    .transpose()
                    .map_err(|e| format!("annotation {key} invalid: {e}"))?
                    .ok_or_else(|| format!("annotation {key} not set"))?;
                let template = info
                    .iter()
                    .filter(|i| devices.iter().any(|d| i["UUID"] == d.uuid.as_str()))
                    .find_map(|i| i["temp"].as_str().filter(|t| !t.is_empty()));
                if let Some(template) = template {
                    env.insert("ASCEND_VNPU_SPECS".into(), template.into());
                }
            }
            Vendor::EnflameGcu => {
                env.insert("ENFLAME_VISIBLE_DEVICES".into(), indexes);
            }
            Vendor::MetaxGpu => {
                env.insert("TESSERA_MOCK_METAX_GPUS".into(), indexes);
            }
            Vendor::Cambricon
            | Vendor::EnflameDrs
            | Vendor::KunlunxinXpu
            | Vendor::Mthreads
            | Vendor::Neuron { .. } => {
                return Err(format!(
                    "{}'s plugin reads no devices-to-allocate list",
                    self.vendor.family()
                ));
            }
            Vendor::Amd { .. } => {
                let ids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
                env.insert("ROCR_VISIBLE_DEVICES".into(), ids.join(","));
                let mut masks = Vec::new();
                for (i, d) in devices.iter().enumerate() {
                    let total = self.devices[index(&d.uuid)?].cores;
                    let cus = state.take_cus(&d.uuid, total, d.cores)?;
                    masks.push(format!("{i}:{}", cu_list(&cus)));
                }
                env.insert("HSA_CU_MASK".into(), masks.join(";"));
                if let Some(first) = devices.first() {
                    env.insert(
                        "HIP_DEVICE_MEMORY_LIMIT".into(),
                        format!("{}m", first.memory_mib),
                    );
                }
            }
        }
        Ok(env)
    }

    /// Registers on the Node and serves the kubelet until the process stops.
    pub async fn run(self, client: Client) -> Result<(), Error> {
        let register = {
            let (plugin, client) = (self.clone(), client.clone());
            async move {
                loop {
                    if let Err(error) = plugin.register(&client).await {
                        tracing::warn!(%error, "register pass failed; retrying");
                    }
                    tokio::time::sleep(plugin.interval).await;
                }
            }
        };
        tokio::select! {
            () = register => Ok(()),
            result = service::serve(self, client) => result,
        }
    }

    async fn register(&self, client: &Client) -> Result<(), Error> {
        let annotations = self.register_annotations(Timestamp::now());
        if annotations.is_empty() {
            return Ok(());
        }
        Api::<Node>::all(client.clone())
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await?;
        Ok(())
    }

    /// The pod the kubelet is allocating for (HAMi's `GetPendingPod`).
    async fn pending_pod(&self, client: &Client) -> Result<Pod, String> {
        let node = Api::<Node>::all(client.clone())
            .get(&self.node)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(lock) = node.annotations().get("hami.io/mutex.lock") {
            let parts: Vec<&str> = lock.split(',').collect();
            if let [_, namespace, name] = parts.as_slice() {
                return Api::<Pod>::namespaced(client.clone(), namespace)
                    .get(name)
                    .await
                    .map_err(|e| e.to_string());
            }
        }
        self.node_pods(client)
            .await?
            .into_iter()
            .find(|p| {
                let a = p.annotations();
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
                    && a.contains_key("hami.io/bind-time")
                    && matches!(
                        a.get("hami.io/bind-phase").map(String::as_str),
                        Some("allocating" | "success")
                    )
                    && a.get("hami.io/vgpu-node") == Some(&self.node)
            })
            .ok_or_else(|| format!("no binding pod found on node {}", self.node))
    }

    /// The pods bound to the node.
    async fn node_pods(&self, client: &Client) -> Result<Vec<Pod>, String> {
        let on_node = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        Api::<Pod>::all(client.clone())
            .list(&on_node)
            .await
            .map(|list| list.items)
            .map_err(|e| format!("list Pods: {e}"))
    }

    /// Fails unless the Node's `hami.io/mutex.lock` names `pod` (the AMD
    /// plugin's `validateNodeLockOwner`).
    async fn check_lock_owner(&self, client: &Client, pod: &Pod) -> Result<(), String> {
        let node = Api::<Node>::all(client.clone())
            .get(&self.node)
            .await
            .map_err(|e| format!("get node {}: {e}", self.node))?;
        let lock = node
            .annotations()
            .get("hami.io/mutex.lock")
            .ok_or_else(|| {
                format!(
                    "node {} lock is missing before CU allocation commit",
                    self.node
                )
            })?;
        let owner = format!(
            ",{},{}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        );
        if lock.ends_with(&owner) {
            Ok(())
        } else {
            Err(format!(
                "node {} lock is owned by {lock}, not this pod",
                self.node
            ))
        }
    }

    /// Sets `bind-phase` and releases the Node lock when it is the pod's
    /// (HAMi's `updatePodAnnotationsAndReleaseLock`).
    async fn finish(&self, client: &Client, pod: &Pod, phase: &str) {
        let namespace = pod.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let set = json!({"metadata": {"annotations": {"hami.io/bind-phase": phase}}});
        if let Err(error) = pods
            .patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(set))
            .await
        {
            tracing::warn!(%error, "could not set bind-phase");
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let owner = format!(",{namespace},{}", pod.name_any());
        let ours = nodes.get(&self.node).await.ok().is_some_and(|n| {
            n.annotations()
                .get("hami.io/mutex.lock")
                .is_some_and(|v| v.ends_with(&owner))
        });
        if ours {
            let release = json!({"metadata": {"annotations": {"hami.io/mutex.lock": null}}});
            if let Err(error) = nodes
                .patch(&self.node, &PatchParams::default(), &Patch::Merge(release))
                .await
            {
                tracing::warn!(%error, "could not release hami.io/mutex.lock");
            }
        }
    }
}
