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
mod protocol;
mod service;

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use amd::AllocateState;
pub use fleet::{
    amd_mi300x, ascend_910b4, cambricon_mlu370, chart_values, enflame_gcus, enflame_s60,
    hygon_dcus, iluvatar_mr_v100, kunlunxin_whole_xpus, kunlunxin_xpus, metax_c500, metax_gpus,
    mthreads_s4000, neuron_devices,
};
pub use protocol::{
    Handed, all_served, cu_list, decode, encode, first_free_cus, parse_cu_list, pop_next,
};

use crate::Error;

/// The node's pods (`spec.nodeName`), only those in `phase` when given.
pub(crate) async fn pods_on(
    client: &Client,
    node: &str,
    phase: Option<&str>,
) -> Result<Vec<Pod>, String> {
    let mut selector = format!("spec.nodeName={node}");
    if let Some(phase) = phase {
        selector.push_str(&format!(",status.phase={phase}"));
    }
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items)
        .map_err(|e| format!("failed to list the pods assigned to node {node}: {e}"))
}

/// The node's pending pods, as the plugins that find their pod themselves
/// list them.
pub(crate) async fn pending_on(client: &Client, node: &str) -> Result<Vec<Pod>, String> {
    pods_on(client, node, Some("Pending")).await
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
        pods_on(client, &self.node, None).await
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
