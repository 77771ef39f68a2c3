//! Whether the cluster serves DRA at all: `resource.k8s.io/v1` with
//! ResourceClaims and ResourceSlices (Kubernetes 1.34 and later, unless
//! turned off). Asked once at start, before anything of DRA runs, so a
//! cluster without it never has a failed list or watch read as anything.

use std::time::Duration;

use kube::Client;

/// The API group version Tessera's DRA door speaks.
pub const RESOURCE_V1: &str = "resource.k8s.io/v1";

/// Asks the API server whether it serves [`RESOURCE_V1`] with both
/// resources the door needs. A 404 (or a version without them) is `false`;
/// other failures are retried until the server answers, as a guess either
/// way would be wrong for as long as the agent runs.
pub async fn dra_served(client: &Client) -> bool {
    let mut pause = Duration::from_millis(200);
    loop {
        match client.list_api_group_resources(RESOURCE_V1).await {
            Ok(list) => {
                let names: Vec<&str> = list.resources.iter().map(|r| r.name.as_str()).collect();
                return serves_door(&names);
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(error) => {
                tracing::warn!(%error, api = RESOURCE_V1, "asking the API server whether it serves DRA; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Whether the resources a group version lists include those the door
/// reads and writes.
fn serves_door(resources: &[&str]) -> bool {
    ["resourceclaims", "resourceslices"]
        .iter()
        .all(|wanted| resources.contains(wanted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_door_needs_claims_and_slices() {
        let full = [
            "deviceclasses",
            "resourceclaims",
            "resourceclaims/status",
            "resourceslices",
        ];
        assert!(serves_door(&full));
        assert!(!serves_door(&["resourceclaims"]));
        assert!(!serves_door(&[]));
    }
}
