//! Dynamic MIG: the scheduler picks a MIG profile and placement for each
//! slice at Bind; Allocate creates the instance (or finds it from an earlier
//! try) and the container sees the instances, with no interposer (the
//! hardware isolates them; HAMi's MIG mode does the same). Serving it needs
//! the node's MIG machinery, so it is `mig::DynamicMig`.

use tessera_api::v1alpha1::{GpuDevice, NodeSettings};

use super::mode::{Offering, in_mig_mode, unhealthy};
use crate::{backend::PhysicalMig, holders::MigHolders};

/// Offers the whole GPU with its MIG layout (the profiles `migProfiles`
/// allows) and its instances; the scheduler cuts from it.
pub struct DynamicMigOffer;

impl Offering for DynamicMigOffer {
    fn offer(
        &self,
        whole: GpuDevice,
        mig: Option<&PhysicalMig>,
        settings: &NodeSettings,
        holders: &MigHolders,
    ) -> Vec<GpuDevice> {
        let (mut whole, mig) = match in_mig_mode(whole, mig, holders) {
            Ok(found) => found,
            Err(unhealthy) => return unhealthy,
        };
        let mut layout = mig.layout.clone();
        let allowed = &settings.mig_profiles;
        if !allowed.is_empty() {
            layout.profiles.retain(|p| allowed.contains(&p.name));
            if layout.profiles.is_empty() {
                let has: Vec<&str> = mig
                    .layout
                    .profiles
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect();
                return unhealthy(
                    whole,
                    format!(
                        "migProfiles allows {} but this GPU's profiles are {}: dynamic MIG can create nothing here",
                        allowed.join(", "),
                        has.join(", ")
                    ),
                );
            }
        }
        whole.mig = Some(layout);
        vec![whole]
    }
}
