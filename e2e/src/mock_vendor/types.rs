//! Which vendor a mock plays, its devices, and what it registers with the
//! kubelet.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// Vastai devices, as HAMi expects Vastai's plugin to behave: whole
    /// cards, or dies (HAMi's die mode) where the devices name their card.
    Vastai,
    /// Biren GPUs, as Project-HAMi/biren-device-plugin.
    Biren,
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
            Vendor::Vastai => "vastai",
            Vendor::Biren => "biren",
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
    /// Ascend's `NetworkID`; for Vastai, the card (`AIC`) of a die: a
    /// device that names one registers the node in die mode.
    pub network_id: Option<u32>,
}
