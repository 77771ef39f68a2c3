//! Why a pod does not fit a node, in words a person can act on.
//!
//! The text ends up in the pod's FailedScheduling event, e.g.
//! `container "train" needs 1 GPU with 8000 MiB and 30 cores; 0 of 4 GPUs fit:
//! 3 GPUs without 8000 MiB free (largest free is 6000 MiB on GPU-1c2d…);
//! 1 GPU excluded by nvidia.com/nouse-gputype`.

use std::fmt::{self, Write};

use crate::request::{ContainerRequest, DrsAsk, MemoryRequest, PodRequest, Wording};
use tessera_api::{
    mig,
    names::{annotations, ascend, metax},
    v1alpha1::AppClass,
};

use super::{
    node::{DeviceUsage, GpuDevice},
    placement::EXCLUSIVE_CORES,
};

/// Why one device cannot take a slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    Unhealthy,
    TypeNotWanted,
    TypeExcluded,
    UuidNotWanted,
    UuidExcluded,
    ModeMismatch,
    HeldExclusively,
    NotEmptyForExclusive,
    NoFreeSlice,
    Memory,
    Cores,
    MpsOneGpu,
    MigNoRoom,
    CoresExhausted,
    NoSoftSplit,
    OtherCardOfPod,
    OtherSize,
    NoProfile,
    AppClass,
    QosPolicy,
    Cordoned,
    Busy,
}

const CAUSES: usize = 22;

/// Tally of why devices were rejected for one container.
#[derive(Debug, Default)]
pub(super) struct Census {
    counts: [u32; CAUSES],
    largest_free_memory: Option<(u64, String)>,
    most_free_cores: Option<(u32, String)>,
    /// The MIG device with the most free memory slices: its free count,
    /// UUID, the profile the request needs and what is free there.
    roomiest_mig: Option<(u32, String, String, String)>,
}

impl Census {
    pub(super) fn note(
        &mut self,
        cause: Cause,
        device: &GpuDevice,
        used: &DeviceUsage,
        container: &ContainerRequest,
    ) {
        self.counts[cause as usize] += 1;
        match cause {
            Cause::MigNoRoom => {
                let Some(layout) = &device.mig else { return };
                let occupied = used.mig_mask() | device.mig_present;
                let free = layout.memory_slices.saturating_sub(occupied.count_ones());
                if self.roomiest_mig.as_ref().is_none_or(|(f, ..)| free > *f) {
                    let memory = container.memory.resolve(device.memory_mib).max(1);
                    let needed =
                        match mig::fitting_profiles(layout, memory, container.cores).first() {
                            Some((_, profile)) => format!("needs a {} placement", profile.name),
                            None => format!(
                                "no profile of its {} has {memory} MiB and {} cores",
                                device.model, container.cores
                            ),
                        };
                    self.roomiest_mig = Some((
                        free,
                        device.uuid.clone(),
                        needed,
                        mig::describe_free(layout, occupied),
                    ));
                }
            }
            Cause::Memory => {
                let free = device.memory_mib.saturating_sub(used.memory_mib);
                if self
                    .largest_free_memory
                    .as_ref()
                    .is_none_or(|(f, _)| free > *f)
                {
                    self.largest_free_memory = Some((free, device.uuid.clone()));
                }
            }
            Cause::Cores => {
                let free = device.cores.saturating_sub(used.cores);
                if self.most_free_cores.as_ref().is_none_or(|(f, _)| free > *f) {
                    self.most_free_cores = Some((free, device.uuid.clone()));
                }
            }
            _ => {}
        }
    }

    pub(super) fn into_rejection(
        self,
        container: &ContainerRequest,
        fitting: usize,
        total: usize,
    ) -> Rejection {
        let mut message = needs(container, fitting, total);
        let noun = noun(container);
        if total == 0 {
            let _ = write!(message, ": the node has no {noun}s");
            return Rejection {
                message,
                lack: None,
            };
        }
        let keys = wording(container);
        let mut parts = Vec::new();
        let mut part = |cause: Cause, text: String| {
            let n = self.counts[cause as usize];
            if n > 0 {
                parts.push(format!(
                    "{n} {noun}{} {text}",
                    if n == 1 { "" } else { "s" }
                ));
            }
        };
        part(Cause::Unhealthy, "unhealthy".into());
        part(
            Cause::Cordoned,
            format!(
                "cordoned ({} on the Node or a GpuNodeConfig's cordonDevices; the GpuNode's devices name which)",
                annotations::DEVICE_CORDON
            ),
        );
        part(
            Cause::TypeNotWanted,
            format!("not of a type in {}", keys.use_type),
        );
        part(
            Cause::TypeExcluded,
            format!("excluded by {}", keys.nouse_type),
        );
        part(
            Cause::UuidNotWanted,
            format!("not listed in {}", keys.use_uuid),
        );
        part(
            Cause::UuidExcluded,
            format!("excluded by {}", keys.nouse_uuid),
        );
        part(
            Cause::ModeMismatch,
            format!("not in the mode {} asks for", annotations::VGPU_MODE),
        );
        part(
            Cause::NoSoftSplit,
            format!(
                "on a node without hami-vnpu-core, which {}: {} needs (node annotation {}: \"true\")",
                ascend::VNPU_MODE,
                ascend::HAMI_CORE,
                ascend::NODE_SOFT_SPLIT
            ),
        );
        part(
            Cause::HeldExclusively,
            "held exclusively by another container".into(),
        );
        part(
            Cause::Busy,
            format!(
                "in use, but mutex in {} takes idle {noun}s only",
                annotations::GPU_SCHEDULER_POLICY
            ),
        );
        part(
            Cause::NotEmptyForExclusive,
            format!("in use, but {EXCLUSIVE_CORES} cores needs an empty {noun}"),
        );
        part(Cause::NoFreeSlice, "with no free slice".into());
        part(
            Cause::CoresExhausted,
            "with every core handed out, so a request for 0 cores may not share it".into(),
        );
        part(
            Cause::OtherCardOfPod,
            "not the card the pod's other containers use (one card per pod)".into(),
        );
        part(
            Cause::NoProfile,
            format!("without a DRS profile for {}", drs_ask(container)),
        );
        part(Cause::AppClass, app_class_rule(container));
        part(
            Cause::QosPolicy,
            format!(
                "running sGPUs of another QoS policy than {} {:?} (a GPU's shared sGPUs run under one policy)",
                metax::QOS_POLICY,
                container
                    .vendor
                    .as_ref()
                    .and_then(|v| v.sharing?.qos_policy)
                    .map_or("", |q| q.as_str())
            ),
        );
        part(
            Cause::OtherSize,
            "holding vXPUs of another size (an XPU shares only vXPUs of one size)".into(),
        );
        part(
            Cause::MpsOneGpu,
            "in MPS mode, which serves one GPU per container (one MPS daemon per GPU)".into(),
        );
        if let Some((_, uuid, needed, free)) = &self.roomiest_mig {
            part(
                Cause::MigNoRoom,
                format!("in MIG mode without room ({uuid} {needed}; free there: {free})"),
            );
        }
        if let Some((free, uuid)) = &self.largest_free_memory {
            part(
                Cause::Memory,
                format!(
                    "without {} free (largest free is {free} MiB on {uuid})",
                    memory(container.memory)
                ),
            );
        }
        if let Some((free, uuid)) = &self.most_free_cores {
            let (wanted, unit) = if container.family.cores_are_units() {
                (format!("{}% of the compute units", container.cores), " CUs")
            } else {
                (format!("{} cores", container.cores), "")
            };
            part(
                Cause::Cores,
                format!("without {wanted} free (most free is {free}{unit} on {uuid})"),
            );
        }
        if !parts.is_empty() {
            let _ = write!(message, ": {}", parts.join("; "));
        }
        let lack = self.lack();
        Rejection { message, lack }
    }

    /// What the devices lacked most, of what the tuning guide acts on:
    /// free slices, memory or cores (ties in that order).
    fn lack(&self) -> Option<Lack> {
        let count =
            |causes: &[Cause]| -> u32 { causes.iter().map(|&c| self.counts[c as usize]).sum() };
        [
            (Lack::Slice, count(&[Cause::NoFreeSlice])),
            (Lack::Memory, count(&[Cause::Memory])),
            (Lack::Cores, count(&[Cause::Cores, Cause::CoresExhausted])),
        ]
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .fold(None::<(Lack, u32)>, |best, (lack, n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((lack, n)),
        })
        .map(|(lack, _)| lack)
    }
}

/// What a node's devices lacked for a pod, as the tuning guide's decision
/// tree reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lack {
    /// Every device held its split count of pods.
    Slice,
    /// No device had the memory free.
    Memory,
    /// No device had the cores free.
    Cores,
}

impl Lack {
    /// The label value: `slice`, `memory` or `cores`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slice => "slice",
            Self::Memory => "memory",
            Self::Cores => "cores",
        }
    }
}

/// MetaX's co-location rule, as it bars the container's app class.
fn app_class_rule(container: &ContainerRequest) -> String {
    let class = container.vendor.as_ref().and_then(|v| v.sharing?.app_class);
    match class {
        None => format!(
            "running online or offline pods, which share a GPU only with each other ({} absent)",
            metax::APP_CLASS
        ),
        Some(AppClass::Offline) => format!(
            "running pods without an app class, or online pods, which take no offline pod ({}: offline)",
            metax::APP_CLASS
        ),
        Some(AppClass::Online) => format!(
            "running pods without an app class, which share a GPU only with each other ({}: online)",
            metax::APP_CLASS
        ),
    }
}

/// Why a pod does not fit a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    message: String,
    lack: Option<Lack>,
}

impl Rejection {
    /// The explanation.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What the node's devices lacked most, when it was slices, memory or
    /// cores.
    pub fn lack(&self) -> Option<Lack> {
        self.lack
    }

    /// A pod asking for NVIDIA GPUs and another family's devices: Tessera's
    /// node agent serves a pod's NVIDIA GPUs and the other vendor's plugin
    /// the rest, and the two cannot hand one pod its devices together (each
    /// would finish the Bind on its own), so no node takes such a pod.
    pub(super) fn nvidia_with_another_family(request: &PodRequest) -> Option<Self> {
        let nvidia = request.containers.iter().find(|c| c.family.is_nvidia())?;
        let other = request.containers.iter().find(|c| !c.family.is_nvidia())?;
        let asks = if nvidia.name == other.name {
            format!(
                "container {:?} asks for NVIDIA GPUs and {} devices",
                nvidia.name,
                other.family.as_str()
            )
        } else {
            format!(
                "container {:?} asks for NVIDIA GPUs and container {:?} for {} devices",
                nvidia.name,
                other.name,
                other.family.as_str()
            )
        };
        Some(Self {
            message: format!(
                "{asks}: a pod gets NVIDIA GPUs from Tessera's node agent or another family's devices from its vendor's plugin, not both (docs/vendors.md, mixed nodes)"
            ),
            lack: None,
        })
    }

    pub(super) fn pairs(
        container: &ContainerRequest,
        fitting: usize,
        whole: usize,
        total: usize,
    ) -> Self {
        let mut message = needs(container, fitting, total);
        let _ = write!(
            message,
            ": {} NPUs are allocated in module pairs and only {whole} module{} {} both NPUs free (needs {})",
            container
                .vendor
                .as_ref()
                .and_then(|v| v.device_type.as_deref())
                .unwrap_or("Ascend910C"),
            if whole == 1 { "" } else { "s" },
            if whole == 1 { "has" } else { "have" },
            container.count / 2
        );
        Self {
            message,
            lack: None,
        }
    }

    pub(super) fn wings(container: &ContainerRequest, fitting: &[u32], total: usize) -> Self {
        let mut message = needs(container, fitting.len(), total);
        let listed: Vec<String> = fitting.iter().map(u32::to_string).collect();
        let _ = write!(
            message,
            ": Kunlunxin places {} XPUs within one wing (0-3 or 4-7) or as a linked set across the wings, and the fitting XPUs ({}) hold none",
            container.count,
            listed.join(", ")
        );
        Self {
            message,
            lack: None,
        }
    }

    pub(super) fn consecutive(
        container: &ContainerRequest,
        free: &[u32],
        total: usize,
        ring: bool,
    ) -> Self {
        let mut message = needs(container, free.len(), total);
        if !ring && !matches!(container.count, 4 | 8 | 16) {
            let _ = write!(
                message,
                ": AWS Neuron places 1, 4, 8 or 16 devices on a Trainium node, not {}",
                container.count
            );
            return Self {
                message,
                lack: None,
            };
        }
        let rule = if ring {
            "on consecutive free devices (Inferentia's ring)".to_owned()
        } else {
            format!(
                "on an aligned block of {} free devices (Trainium)",
                container.count
            )
        };
        let listed: Vec<String> = free.iter().map(u32::to_string).collect();
        let _ = write!(
            message,
            ": AWS Neuron places {} devices {rule}, and the free devices ({}) hold none",
            container.count,
            listed.join(", ")
        );
        Self {
            message,
            lack: None,
        }
    }

    pub(super) fn numa(
        container: &ContainerRequest,
        fitting: usize,
        best: usize,
        total: usize,
    ) -> Self {
        let mut message = needs(container, fitting, total);
        let _ = write!(
            message,
            ": {} is set and no NUMA node has {} fitting GPUs (at most {best} on one)",
            annotations::NUMA_BIND,
            container.count
        );
        Self {
            message,
            lack: None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn needs(container: &ContainerRequest, fitting: usize, total: usize) -> String {
    let count = container.count;
    let noun = noun(container);
    let s = if count == 1 { "" } else { "s" };
    // Devices counted, not measured (Vastai, Biren): nothing to ask of each.
    let counted = container.memory == MemoryRequest::Mib(0)
        && container.cores == 0
        && container.vendor.as_ref().is_none_or(|v| v.drs.is_none());
    if counted {
        return format!(
            "container {:?} needs {count} {noun}{s}; {fitting} of {total} {noun}s fit",
            container.name
        );
    }
    let template = container
        .vendor
        .as_ref()
        .and_then(|v| v.template.as_deref())
        .map(|t| format!(" (vNPU template {t})"))
        .unwrap_or_default();
    let with = if container.vendor.as_ref().is_some_and(|v| v.drs.is_some()) {
        format!("a DRS partition of {}", drs_ask(container))
    } else if container.family.cores_by_index() {
        // Neuron devices have no memory; cores are NeuronCores.
        if container.cores >= EXCLUSIVE_CORES {
            "all its NeuronCores".to_owned()
        } else {
            format!("{} NeuronCores", container.cores)
        }
    } else if container.family.cores_are_units() {
        format!(
            "{}{template} and {}% of the compute units",
            memory(container.memory),
            container.cores
        )
    } else {
        format!(
            "{}{template} and {} cores",
            memory(container.memory),
            container.cores
        )
    };
    format!(
        "container {:?} needs {count} {noun}{s} with {with}{}; {fitting} of {total} {noun}s fit",
        container.name,
        if count == 1 { "" } else { " each" },
    )
}

/// How reasons name the container's devices and filters: its family's
/// words ([`Wording`]), NVIDIA's for a request without a vendor part.
fn wording(container: &ContainerRequest) -> &Wording {
    static NVIDIA: Wording = Wording::NVIDIA;
    container.vendor.as_ref().map_or(&NVIDIA, |v| &v.wording)
}

/// What one device of the container's family is called in a reason.
fn noun(container: &ContainerRequest) -> &str {
    &wording(container).noun
}

/// An Enflame DRS ask in words.
fn drs_ask(container: &ContainerRequest) -> String {
    match container.vendor.as_ref().and_then(|v| v.drs) {
        Some(DrsAsk::Slices(n)) => format!("{n} slices"),
        Some(DrsAsk::Spec { memory, cores }) => {
            format!(
                "{memory} of memory (GB, or MiB above twice the largest profile) and {cores}% of the cores"
            )
        }
        None => String::new(),
    }
}

fn memory(request: MemoryRequest) -> String {
    match request {
        MemoryRequest::Mib(mib) => format!("{mib} MiB"),
        MemoryRequest::Percent(100) => "all memory".to_owned(),
        MemoryRequest::Percent(p) => format!("{p}% of memory"),
    }
}
