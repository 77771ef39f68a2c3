//! The sharing modes, how a node's settings pick one, and what a mode
//! implements.

use std::path::PathBuf;

use tessera_api::v1alpha1::{
    DeviceHealth, DeviceSlice, GpuDevice, MigStrategy, NodeSettings, OperatingMode,
};

use crate::{Error, backend::PhysicalMig, contract::Contract, holders::MigHolders};

/// How the node shares its GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Slices of a GPU, the interposer enforcing them (`operatingMode:
    /// hami-core`).
    HamiCore,
    /// MIG instances cut at Bind for each slice (`mig`, `migStrategy: none`).
    DynamicMig,
    /// The operator's MIG instances, one `nvidia.com/mig-<profile>`
    /// resource each (`mig`, `migStrategy: mixed`).
    StaticMig,
    /// The operator's MIG instances, each a whole `nvidia.com/gpu` device
    /// (`mig`, `migStrategy: single`).
    MigSingle,
    /// Slices of a GPU, its MPS server enforcing them (`mps`).
    Mps,
}

impl Mode {
    /// The node's mode under `settings`.
    pub fn of(settings: &NodeSettings) -> Self {
        match (settings.operating_mode, settings.mig_strategy) {
            (OperatingMode::HamiCore, _) => Self::HamiCore,
            (OperatingMode::Mps, _) => Self::Mps,
            (OperatingMode::Mig, MigStrategy::None) => Self::DynamicMig,
            (OperatingMode::Mig, MigStrategy::Mixed) => Self::StaticMig,
            (OperatingMode::Mig, MigStrategy::Single) => Self::MigSingle,
        }
    }

    /// The mode that serves a container holding `slices` on a node under
    /// `settings`: dynamic MIG when the scheduler cut MIG instances for it
    /// at Bind (even if the node left that mode since: the instances are
    /// what it was given), MPS on an MPS node, hami-core otherwise (a whole
    /// instance under `single` is a GPU to the interposer).
    pub fn of_container(slices: &[DeviceSlice], settings: &NodeSettings) -> Self {
        if slices.iter().any(|s| s.mig.is_some()) {
            return Self::DynamicMig;
        }
        match Self::of(settings) {
            Self::Mps => Self::Mps,
            _ => Self::HamiCore,
        }
    }

    /// Whether the DRA door publishes the node's GPUs in this mode: it
    /// serves hami-core slices only.
    pub fn through_dra(self) -> bool {
        self == Self::HamiCore
    }

    /// Whether the GPUs of an MPS node each need an MPS control daemon.
    pub fn needs_mps_daemons(self) -> bool {
        self == Self::Mps
    }

    /// Whether the agent makes and destroys the node's MIG instances.
    pub fn makes_mig_instances(self) -> bool {
        self == Self::DynamicMig
    }

    /// Whether the node's instances are served by one device plugin per
    /// profile, and their holders learnt from the kubelet.
    pub fn serves_static_instances(self) -> bool {
        self == Self::StaticMig
    }
}

/// One container to serve, as its allocation describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Container {
    /// The allocation holding its slices, `namespace/name`.
    pub holder: String,
    /// The container's name.
    pub name: String,
    /// Its slices, in its CUDA device order.
    pub slices: Vec<DeviceSlice>,
    /// Its priority (HAMi's `nvidia.com/priority`), for the interposer.
    pub priority: Option<u32>,
    /// Its region directory on the host (hami-core's interposer writes
    /// there).
    pub region_dir: PathBuf,
    /// The node's settings when it was served.
    pub settings: NodeSettings,
}

/// How one physical GPU is offered in a mode: pure.
pub trait Offering: Sync {
    /// The devices `whole` (the GPU under the node's settings, whole)
    /// offers, given its MIG state and the holders of its MIG instances. A
    /// GPU that cannot do what the mode asks is offered unhealthy, with the
    /// reason and the fix.
    fn offer(
        &self,
        whole: GpuDevice,
        mig: Option<&PhysicalMig>,
        settings: &NodeSettings,
        holders: &MigHolders,
    ) -> Vec<GpuDevice>;
}

/// How a container is served in a mode.
pub trait Serving: Send + Sync {
    /// What `container` gets, once what that needs on the node is done
    /// (its region directory, its MIG instances, its GPU's MPS daemon).
    /// Blocking: run it off the async runtime.
    fn serve(&self, container: &Container) -> Result<Contract, Error>;
}

/// `device` unhealthy with `message` (kept as it is when already
/// unhealthy, with its own reason).
pub fn unhealthy(mut device: GpuDevice, message: String) -> Vec<GpuDevice> {
    if device.health == DeviceHealth::Healthy {
        device.health = DeviceHealth::Unhealthy;
        device.health_message = Some(message);
    }
    vec![device]
}

/// The prelude of every MIG mode: `whole` with its instances (each with its
/// holder) and its MIG state, or the GPU unhealthy when it cannot do MIG
/// (not MIG-capable, or MIG mode off).
pub fn in_mig_mode<'a>(
    mut whole: GpuDevice,
    mig: Option<&'a PhysicalMig>,
    holders: &MigHolders,
) -> Result<(GpuDevice, &'a PhysicalMig), Vec<GpuDevice>> {
    let index = whole.index;
    let Some(mig) = mig else {
        let model = whole.model.clone();
        return Err(unhealthy(
            whole,
            format!(
                "operatingMode mig: the node agent knows no MIG layout for this {model}: it is not MIG-capable (NVML reports no MIG mode for it)"
            ),
        ));
    };
    if !mig.enabled {
        return Err(unhealthy(
            whole,
            format!(
                "operatingMode mig: MIG mode is off on this GPU; turn it on with nvidia-smi -i {index} -mig 1 (the GPU must be idle)"
            ),
        ));
    }
    whole.mig_instances = mig
        .instances
        .iter()
        .map(|i| tessera_api::v1alpha1::MigInstance {
            held_by: holders.get(&(whole.uuid.clone(), i.placement)).cloned(),
            ..i.clone()
        })
        .collect();
    Ok((whole, mig))
}
