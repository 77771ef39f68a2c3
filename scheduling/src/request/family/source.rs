//! Where a family's device plugin reports its devices on a Node
//! ([`Family::sources`](super::Family::sources)): the controllers' vendor
//! view decodes each [`Source`] by its [`SourceKind`] into the GpuNode
//! Tessera schedules from.

use tessera_api::v1alpha1::DeviceFamily;

/// One place a vendor plugin reports devices on a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The family the devices belong to.
    pub family: DeviceFamily,
    /// The register annotation; `None` for plugins that report only
    /// through the Node's resources.
    pub register: Option<String>,
    /// The handshake annotation; `None` where HAMi has none (AMD: the
    /// plugin lives while the Node advertises `count_resource`).
    pub handshake: Option<String>,
    /// The extended resource the plugin advertises devices as.
    pub count_resource: String,
    /// The device type every device of the source is scheduled as (Ascend:
    /// the chip's `commonWord`); `None`: as the plugin reports it.
    pub device_type: Option<String>,
    /// Where and how the devices are reported.
    pub kind: SourceKind,
    /// Also read the plugin's topology losses and scores by device count
    /// (MetaX whole GPUs: `metax-tech.com/gpu.topology.{losses,scores}`).
    pub topology_maps: bool,
    /// The plugin reports AI cores and cuts devices by its vNPU templates
    /// (Ascend): requests count percent of a device (100), and the
    /// templates are a hard split unless the node runs hami-vnpu-core.
    pub npu_templates: bool,
    /// Every device counts this many cores, whatever the register says
    /// (Vastai, Biren: 100, as HAMi's `GetNodeDevices` sets them for
    /// scoring); `None`: as registered.
    pub cores: Option<u32>,
    /// The plugin may register dies (Vastai): the dies of one card
    /// (`custominfo.AIC`) are on one network, the cards numbered 0, 1, …
    /// in the order the register names them.
    pub dies_by_card: bool,
}

impl Source {
    /// A source of `family`'s devices as `count_resource` advertises them,
    /// reported as `kind`: no register or handshake annotation, the device
    /// type as the plugin reports it.
    pub fn new(family: DeviceFamily, count_resource: &str, kind: SourceKind) -> Self {
        Self {
            family,
            register: None,
            handshake: None,
            count_resource: count_resource.to_owned(),
            device_type: None,
            kind,
            topology_maps: false,
            npu_templates: false,
            cores: None,
            dies_by_card: false,
        }
    }

    /// Reported in the register annotation `register`.
    pub fn register(self, register: impl Into<String>) -> Self {
        Self {
            register: Some(register.into()),
            ..self
        }
    }

    /// With HAMi's register handshake on the annotation `handshake`.
    pub fn handshake(self, handshake: impl Into<String>) -> Self {
        Self {
            handshake: Some(handshake.into()),
            ..self
        }
    }

    /// Every device counted as `cores` cores.
    pub fn cores(self, cores: u32) -> Self {
        Self {
            cores: Some(cores),
            ..self
        }
    }

    /// With dies grouped by their card.
    pub fn dies_by_card(self) -> Self {
        Self {
            dies_by_card: true,
            ..self
        }
    }

    /// Every device scheduled as `device_type`.
    pub fn device_type(self, device_type: impl Into<String>) -> Self {
        Self {
            device_type: Some(device_type.into()),
            ..self
        }
    }
}

/// How a vendor's plugin reports its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// HAMi's CSV register annotation (Hygon, Iluvatar).
    Csv,
    /// HAMi's JSON register annotation (Ascend, AMD, Kunlunxin vXPUs).
    Json,
    /// MetaX's sGPU list (`metax-tech.com/node-gpu-devices`); no handshake.
    MetaxJson,
    /// Enflame's DRS devices and profiles (`enflame.com/gcu-drs-capacity`);
    /// no handshake (HAMi's `CheckHealth` is always healthy).
    EnflameDrs,
    /// Only the count resource in the Node's allocatable: that many whole
    /// cards of `memory_mib` each, one container per card, as HAMi reads
    /// MetaX GPUs (`<node>-metax-<i>`, 65,536 MiB), Enflame GCUs
    /// (`<node>-GCU-<i>`, HAMi's placeholder of 100) and Kunlunxin XPUs
    /// (`<node>-kunlun-<i>`, 98,304 MiB).
    Cards {
        /// MiB of each card.
        memory_mib: u64,
        /// What device ids say after the node's name (`metax`).
        infix: &'static str,
    },
    /// Only the Node's allocatable, as HAMi reads AWS Neuron nodes: the
    /// count resource's devices (`<node>-AWSNeuron-<i>`), each with an
    /// equal share of `cores` (NeuronCores), shared by core, no memory; the
    /// model is the Node's instance type (its topology: `inf` a ring).
    Neuron {
        /// The NeuronCore resource.
        cores: String,
    },
    /// Only the Node's allocatable: 100 of `cores` per card and the cards'
    /// memory in `memory` (in units of `unit_mib`), as HAMi reads Cambricon
    /// nodes (`GetNodeDevices`; HAMi reads capacity, which equals
    /// allocatable for device-plugin resources). No handshake.
    Allocatable {
        /// The cores resource (`per_card` per card).
        cores: String,
        /// The memory resource.
        memory: String,
        /// MiB per unit of the memory resource.
        unit_mib: u64,
        /// Cores of one card (Cambricon 100, Moore Threads 16).
        per_card: u32,
        /// What device ids say after the node's name (`cambricon-mlu`).
        infix: &'static str,
    },
}
