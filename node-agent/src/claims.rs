//! What a ResourceClaim says about this node's pool of Tessera's driver.

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use tessera_api::names::dra::DRIVER;

/// The claim's allocated devices, of every driver and pool, if allocated.
pub fn allocation_results(claim: &ResourceClaim) -> Option<&[DeviceRequestAllocationResult]> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
}

/// Whether a claim holds a device of `node`'s pool of this driver.
pub fn allocated_from(claim: &ResourceClaim, node: &str) -> bool {
    allocation_results(claim)
        .is_some_and(|r| r.iter().any(|r| r.driver == DRIVER && r.pool == node))
}
