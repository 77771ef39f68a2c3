//! Static MIG with `migStrategy: mixed`: the operator's instances, each
//! profile an extended resource of its own (`nvidia.com/mig-3g.20gb`)
//! served by a device plugin of its own (`plugin::static_mig`). The GPU
//! offers no `nvidia.com/gpu` slice; a container gets the instances the
//! kubelet chose, with no interposer (the hardware isolates them).

use tessera_api::v1alpha1::{GpuDevice, NodeSettings};

use super::mode::{Offering, in_mig_mode};
use crate::{backend::PhysicalMig, contract::Contract, holders::MigHolders};

/// Offers the GPU with its instances and no slice to give.
pub struct StaticMigOffer;

impl Offering for StaticMigOffer {
    fn offer(
        &self,
        whole: GpuDevice,
        mig: Option<&PhysicalMig>,
        _: &NodeSettings,
        holders: &MigHolders,
    ) -> Vec<GpuDevice> {
        match in_mig_mode(whole, mig, holders) {
            Ok((mut whole, _)) => {
                whole.split_count = 0;
                vec![whole]
            }
            Err(unhealthy) => unhealthy,
        }
    }
}

/// What a container of a profile's plugin gets: the instances the kubelet
/// chose, and nothing else.
pub fn contract(instances: &[String]) -> Contract {
    Contract {
        visible: instances.to_vec(),
        ..Contract::default()
    }
}
