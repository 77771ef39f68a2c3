//! Static MIG with `migStrategy: single`: every one of the operator's
//! instances is a whole `nvidia.com/gpu` device of its own (split count 1,
//! the instance's memory), booked in the ledger and served like a
//! hami-core GPU ([`super::hami_core`]).

use tessera_api::v1alpha1::{DeviceCapacity, GpuDevice, NodeSettings};

use super::mode::{Offering, in_mig_mode, unhealthy};
use crate::{backend::PhysicalMig, holders::MigHolders};

/// Offers each instance as a device; all of a GPU's instances must be of
/// one profile.
pub struct MigSingleOffer;

impl Offering for MigSingleOffer {
    fn offer(
        &self,
        whole: GpuDevice,
        mig: Option<&PhysicalMig>,
        _: &NodeSettings,
        holders: &MigHolders,
    ) -> Vec<GpuDevice> {
        let (whole, mig) = match in_mig_mode(whole, mig, holders) {
            Ok(found) => found,
            Err(unhealthy) => return unhealthy,
        };
        let mut profiles: Vec<&str> = mig.instances.iter().map(|i| i.profile.as_str()).collect();
        profiles.sort_unstable();
        profiles.dedup();
        if profiles.len() > 1 {
            let found = profiles.join(", ");
            return unhealthy(
                whole,
                format!(
                    "migStrategy single needs instances of one profile on the GPU, found {found}; use migStrategy: mixed"
                ),
            );
        }
        mig.instances
            .iter()
            .map(|instance| GpuDevice {
                family: Default::default(),
                network_id: None,
                uuid: instance.uuid.clone(),
                model: format!("{} MIG {}", whole.model, instance.profile),
                memory_mib: instance.memory_mib,
                capacity: DeviceCapacity {
                    memory_mib: instance.memory_mib,
                    cores: 100,
                },
                split_count: 1,
                mig_instances: Vec::new(),
                ..whole.clone()
            })
            .collect()
    }
}
