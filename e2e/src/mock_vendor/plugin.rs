//! A mock plugin for one node: its resources, the annotations it reads, and
//! how it finds the pod it serves and reports back.

use std::{path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{
    cambricon, enflame, indexed,
    pods::pods_on,
    types::{MockDevice, Registration, Vendor},
};

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
            Vendor::Vastai => "vastaitech.com/va".into(),
            Vendor::Biren => "birentech.com/gpu".into(),
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
            Vendor::Vastai => "Vastai",
            Vendor::Biren => "Biren",
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
            Vendor::Vastai => "hami.io/Vastai-devices-to-allocate".into(),
            // The plugin's InRequestDevices is HAMi's `-allocated` copy.
            Vendor::Biren => "hami.io/Biren-devices-allocated".into(),
        }
    }

    pub(super) fn socket_name(&self) -> String {
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
            Vendor::Vastai => "mock-vastai.sock".into(),
            Vendor::Biren => "mock-biren.sock".into(),
        }
    }

    /// The pod the kubelet is allocating for (HAMi's `GetPendingPod`).
    pub(super) async fn pending_pod(&self, client: &Client) -> Result<Pod, String> {
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
    pub(super) async fn node_pods(&self, client: &Client) -> Result<Vec<Pod>, String> {
        pods_on(client, &self.node, None).await
    }

    /// Fails unless the Node's `hami.io/mutex.lock` names `pod` (the AMD
    /// plugin's `validateNodeLockOwner`).
    pub(super) async fn check_lock_owner(&self, client: &Client, pod: &Pod) -> Result<(), String> {
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
    pub(super) async fn finish(&self, client: &Client, pod: &Pod, phase: &str) {
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
