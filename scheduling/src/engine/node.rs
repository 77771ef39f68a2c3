//! A node's devices and what live allocations hold on them.

use std::sync::Arc;

use tessera_api::{
    mig::{self, Mask},
    v1alpha1::{AppClass, DeviceFamily, MigLayout, OperatingMode, PlacementScore, QosPolicy},
};

use super::placement::{EXCLUSIVE_CORES, MAX_CORE_INDEXES, Slice};

/// One GPU as the scheduler sees it: capacity after scaling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// The GPU's UUID.
    pub uuid: String,
    /// The GPU's index on its node.
    pub index: u32,
    /// The model name; for other vendors the device type they report
    /// (`Ascend910B4`, `DCU`), which a request's type must equal exactly.
    pub model: String,
    /// The accelerator family.
    pub family: DeviceFamily,
    /// The network the device is on, where the vendor reports one (Ascend 910).
    pub network_id: Option<u32>,
    /// Schedulable memory in MiB.
    pub memory_mib: u64,
    /// Schedulable cores: 100 × core scaling (Moore Threads: 16 per card;
    /// AMD: the GPU's compute units).
    pub cores: u32,
    /// Slices the device holds at most.
    pub split_count: u32,
    /// NUMA node, when known.
    pub numa_node: Option<u32>,
    /// Whether the device takes new work.
    pub healthy: bool,
    /// Whether the device is cordoned: healthy, but it takes no new slice
    /// (`hami.io/device-cordon`, a GpuNodeConfig's `cordonDevices`).
    pub cordoned: bool,
    /// How the device is shared.
    pub mode: OperatingMode,
    /// What the device can be cut into when Tessera creates MIG instances
    /// on demand (dynamic MIG); `None` otherwise.
    pub mig: Option<Arc<MigLayout>>,
    /// Memory slices taken by MIG instances the node agent reports on the
    /// hardware. Instances of live allocations are also in the usage; this
    /// keeps the scheduler clear of the others (not yet destroyed after
    /// their pod went, or made by someone else).
    pub mig_present: Mask,
    /// The partitions the vendor's plugin cuts the device into (Enflame
    /// DRS), smallest first; empty elsewhere.
    pub profiles: Vec<Profile>,
    /// The device's minor number, where the vendor's plugin is handed it
    /// (Enflame DRS).
    pub minor: Option<String>,
    /// The QoS policy the vendor's plugin reports the device runs under
    /// (MetaX sGPUs).
    pub qos_policy: Option<QosPolicy>,
}

/// A partition profile of a vendor's device (Enflame DRS `3g.20gb`): how
/// many of the device's slices it takes, its memory and its share of the
/// cores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The profile's name.
    pub name: String,
    /// The plugin's id for it.
    pub id: String,
    /// Slices of the device it takes (`3g`).
    pub size: u32,
    /// Its memory, MiB (`20gb`: 20,480).
    pub memory_mib: u64,
    /// Its cores: ⌈size × 100 / the largest profile's size⌉ percent.
    pub cores: u32,
}

impl GpuDevice {
    /// Whether `slice` takes this device exclusively: 100 cores where cores
    /// count percent, for a slice of one of the device's shares. On AMD
    /// GPUs and AWS Neuron devices (cores are compute units and
    /// NeuronCores) a slice of all of them leaves no room anyway, and an
    /// Enflame DRS partition of several shares is bounded by the shares it
    /// takes (the whole-GCU profile takes them all). A slice taken under the
    /// `mutex` policy takes any device exclusively.
    pub fn is_exclusive(&self, slice: &Slice) -> bool {
        slice.mutex
            || (!self.family.cores_are_units()
                && !self.family.cores_by_index()
                && slice.units <= 1
                && slice.cores >= EXCLUSIVE_CORES)
    }
}

/// What live allocations hold on one device: the fold of their slices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceUsage {
    /// Memory held, MiB.
    pub memory_mib: u64,
    /// Cores held.
    pub cores: u32,
    /// Slices held.
    pub slices: u32,
    /// Exclusive slices held (0 or 1 while I1 holds).
    pub exclusive: u32,
    /// MIG instances holding each memory slice (0 or 1 while I1 holds).
    pub mig_slices: [u8; mig::MAX_MEMORY_SLICES as usize],
    /// Slices holding each core index (AWS NeuronCores; 0 or 1 while I1
    /// holds).
    pub core_holders: [u8; MAX_CORE_INDEXES],
    /// MetaX sGPU slices of online pods.
    pub online: u32,
    /// MetaX sGPU slices of offline pods.
    pub offline: u32,
    /// MetaX shared sGPU slices of pods that are not online, by the QoS
    /// policy they run under: none named, then [`QosPolicy::ALL`]'s order.
    pub qos_holders: [u32; 4],
}

impl DeviceUsage {
    /// Adds a slice (saturating: slices come from VgpuAllocation objects,
    /// whose amounts may be any u64/u32; a device they overflow is full).
    pub fn add(&mut self, slice: &Slice, exclusive: bool) {
        self.memory_mib = self.memory_mib.saturating_add(slice.memory_mib);
        self.cores = self.cores.saturating_add(slice.cores);
        self.slices = self.slices.saturating_add(slice.units.max(1));
        self.exclusive = self.exclusive.saturating_add(u32::from(exclusive));
        for held in self.mig_held(slice) {
            *held = held.saturating_add(1);
        }
        for (i, held) in self.core_holders.iter_mut().enumerate() {
            if slice.core_mask & (1 << i) != 0 {
                *held = held.saturating_add(1);
            }
        }
        self.count_sharing(slice, exclusive, u32::saturating_add);
    }

    /// Removes a slice (never below zero).
    pub fn remove(&mut self, slice: &Slice, exclusive: bool) {
        self.memory_mib = self.memory_mib.saturating_sub(slice.memory_mib);
        self.cores = self.cores.saturating_sub(slice.cores);
        self.slices = self.slices.saturating_sub(slice.units.max(1));
        self.exclusive = self.exclusive.saturating_sub(u32::from(exclusive));
        for held in self.mig_held(slice) {
            *held = held.saturating_sub(1);
        }
        for (i, held) in self.core_holders.iter_mut().enumerate() {
            if slice.core_mask & (1 << i) != 0 {
                *held = held.saturating_sub(1);
            }
        }
        self.count_sharing(slice, exclusive, u32::saturating_sub);
    }

    /// Counts a MetaX sGPU slice by its app class, and (a shared slice of
    /// a pod that is not online) by its QoS policy; other slices are not
    /// counted.
    fn count_sharing(&mut self, slice: &Slice, exclusive: bool, step: fn(u32, u32) -> u32) {
        let Some(sharing) = slice.sharing else {
            return;
        };
        match sharing.app_class {
            Some(AppClass::Online) => self.online = step(self.online, 1),
            Some(AppClass::Offline) => self.offline = step(self.offline, 1),
            None => {}
        }
        if !sharing.is_online() && !exclusive {
            let at = sharing
                .qos_policy
                .and_then(|q| QosPolicy::ALL.iter().position(|p| *p == q))
                .map_or(0, |i| i + 1);
            self.qos_holders[at] = step(self.qos_holders[at], 1);
        }
    }

    /// Whether a MetaX sGPU of app class `asked` may join the device
    /// (HAMi's `checkAppClass`): an empty device takes any; online and
    /// offline pods share only with each other, pods without a class only
    /// with each other; a device running an online pod takes no offline one.
    pub fn takes_class(&self, asked: Option<AppClass>) -> bool {
        if self.slices == 0 {
            return true;
        }
        let classed = self.online + self.offline > 0;
        classed == asked.is_some() && !(self.online > 0 && asked == Some(AppClass::Offline))
    }

    /// Whether a shared sGPU of QoS policy `asked` may join the device
    /// (HAMi's `checkDeviceQos`): an empty device takes any policy; a
    /// device with sGPUs of pods that are not online, only their policy (any
    /// when one of them names none); otherwise the policy the plugin
    /// `reports` it runs under, if it reports one.
    pub fn takes_qos(&self, reported: Option<QosPolicy>, asked: Option<QosPolicy>) -> bool {
        if self.slices == 0 || self.qos_holders[0] > 0 {
            return true;
        }
        let mut held = QosPolicy::ALL
            .iter()
            .zip(&self.qos_holders[1..])
            .filter(|(_, holders)| **holders > 0)
            .map(|(policy, _)| Some(*policy))
            .peekable();
        if held.peek().is_none() {
            return reported.is_none() || reported == asked;
        }
        held.all(|policy| policy == asked)
    }

    /// The core indexes live slices hold, as a mask.
    pub fn core_mask(&self) -> u8 {
        self.core_holders
            .iter()
            .enumerate()
            .filter(|(_, held)| **held > 0)
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }

    /// The counters of the memory slices a MIG slice covers (none for other
    /// slices, or a placement off the GPU).
    fn mig_held(&mut self, slice: &Slice) -> impl Iterator<Item = &mut u8> {
        let mask = slice
            .mig
            .and_then(|cut| mig::span(cut.placement))
            .unwrap_or(0);
        self.mig_slices
            .iter_mut()
            .enumerate()
            .filter(move |(i, _)| mask & (1 << i) != 0)
            .map(|(_, held)| held)
    }

    /// The memory slices MIG instances of live allocations hold.
    pub fn mig_mask(&self) -> Mask {
        self.mig_slices
            .iter()
            .enumerate()
            .filter(|(_, held)| **held > 0)
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }
}

/// A node's devices with their usage; `usage[i]` belongs to `devices[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeGpus {
    /// The devices.
    pub devices: Vec<GpuDevice>,
    /// Usage per device.
    pub usage: Vec<DeviceUsage>,
    /// The vendor plugin's topology losses and scores by how many whole
    /// devices a pod takes (MetaX GPUs).
    pub placement_scores: Vec<PlacementScore>,
}

impl NodeGpus {
    /// A node with nothing allocated.
    pub fn new(devices: Vec<GpuDevice>) -> Self {
        let usage = vec![DeviceUsage::default(); devices.len()];
        Self {
            devices,
            usage,
            placement_scores: Vec::new(),
        }
    }

    /// Adds a slice to its device's usage.
    pub fn charge(&mut self, slice: &Slice) {
        if let (Some(device), Some(usage)) = (
            self.devices.get(slice.device),
            self.usage.get_mut(slice.device),
        ) {
            usage.add(slice, device.is_exclusive(slice));
        }
    }

    /// Removes a slice from its device's usage.
    pub fn release(&mut self, slice: &Slice) {
        if let (Some(device), Some(usage)) = (
            self.devices.get(slice.device),
            self.usage.get_mut(slice.device),
        ) {
            usage.remove(slice, device.is_exclusive(slice));
        }
    }

    /// The position of the device with this UUID.
    pub fn position(&self, uuid: &str) -> Option<usize> {
        self.devices.iter().position(|d| d.uuid == uuid)
    }

    /// Whether every device is within its capacity (invariant I1).
    pub fn within_capacity(&self) -> bool {
        self.devices.iter().zip(&self.usage).all(|(d, u)| {
            u.memory_mib <= d.memory_mib
                && u.cores <= d.cores
                && u.slices <= d.split_count
                && (u.exclusive == 0 || u.slices == 1)
                && u.mig_slices.iter().all(|&held| held <= 1)
                && u.core_holders.iter().all(|&held| held <= 1)
        })
    }
}
