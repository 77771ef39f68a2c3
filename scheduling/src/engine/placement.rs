//! What the engine decides: each container's slices of the node's devices.

use tessera_api::v1alpha1::{MigPlacement, Sharing};

/// Cores that make a slice exclusive.
pub const EXCLUSIVE_CORES: u32 = 100;

/// A slice of one device given to a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slice {
    /// Position of the device in [`NodeGpus::devices`].
    pub device: usize,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// Percent of SMs (vendors: the device's own unit, see
    /// [`GpuDevice::cores`]).
    pub cores: u32,
    /// The MIG instance serving the slice, on a dynamic-MIG device.
    pub mig: Option<MigCut>,
    /// The device cores it holds by index, as a mask (AWS NeuronCores,
    /// which the plugin hands out by index); 0 elsewhere.
    pub core_mask: u8,
    /// How many of the device's slices it takes (`split_count` counts
    /// them): an Enflame DRS partition's size; 1 elsewhere.
    pub units: u32,
    /// The device's profile it is cut as (Enflame DRS), by position.
    pub profile: Option<u8>,
    /// How it shares its device (MetaX sGPUs: app class and QoS policy).
    pub sharing: Option<Sharing>,
    /// Taken under the `mutex` GPU policy: the device was idle and takes
    /// no other slice while this one lives.
    pub mutex: bool,
}

impl Slice {
    /// A plain slice of `device`: `memory_mib` and `cores`, one share, no
    /// MIG instance, core indexes, profile or sharing rule.
    pub fn plain(device: usize, memory_mib: u64, cores: u32) -> Self {
        Self {
            device,
            memory_mib,
            cores,
            mig: None,
            core_mask: 0,
            units: 1,
            profile: None,
            sharing: None,
            mutex: false,
        }
    }
}

/// Cores a device may hand out by index (bits of [`Slice::core_mask`]).
pub const MAX_CORE_INDEXES: usize = 8;

/// The core indexes a mask names, ascending.
pub fn core_indexes(mask: u8) -> Vec<u32> {
    (0..MAX_CORE_INDEXES as u32)
        .filter(|bit| mask & (1 << bit) != 0)
        .collect()
}

/// The mask of core indexes (those past [`MAX_CORE_INDEXES`] ignored: no
/// device hands out more).
pub fn core_mask(indexes: &[u32]) -> u8 {
    indexes
        .iter()
        .filter(|&&i| (i as usize) < MAX_CORE_INDEXES)
        .fold(0, |mask, &i| mask | (1 << i))
}

/// A MIG instance to create: which profile of the device's layout, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MigCut {
    /// Position of the profile in the device's [`MigLayout::profiles`]
    /// (`None` for a slice read back from an allocation: only its
    /// placement counts there).
    ///
    /// [`MigLayout::profiles`]: tessera_api::v1alpha1::MigLayout::profiles
    pub profile: Option<usize>,
    /// Where on the device.
    pub placement: MigPlacement,
}

/// The slices one container gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPlacement {
    /// The container's name.
    pub name: String,
    /// One slice per requested vGPU, on distinct devices.
    pub slices: Vec<Slice>,
}

/// Where every GPU container of a pod goes on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Containers in request order.
    pub containers: Vec<ContainerPlacement>,
    /// Each of the node's devices' cores (100 × core scaling for NVIDIA),
    /// by position ([`Slice::device`]): what an NVIDIA slice of 0 cores,
    /// which runs with no compute limit, counts against a cores quota
    /// ([`quota::charge`](super::quota::charge)).
    pub device_cores: Vec<u32>,
}

impl Placement {
    /// Every slice of every container.
    pub fn slices(&self) -> impl Iterator<Item = &Slice> {
        self.containers.iter().flat_map(|c| &c.slices)
    }
}
