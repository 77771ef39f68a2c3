//! kwok (sigs.k8s.io/kwok, built by `hack/tools.sh`) on a [`ControlPlane`]:
//! it plays the kubelet of every Node annotated [`ANNOTATION`]`=fake`,
//! making it Ready and its bound pods Running, with the stages in
//! `stages.yaml` (no heartbeats, no Leases worth renewing: a few thousand
//! simulated nodes must not swamp a 2-core control plane).

use crate::{control_plane::ControlPlane, error::Error, tools};

/// The annotation that hands a Node to kwok (value `fake`).
pub const ANNOTATION: &str = "kwok.x-k8s.io/node";

/// What kwok does to nodes and pods.
const STAGES: &str = include_str!("stages.yaml");

/// kwok's node Lease duration. It renews each managed node's Lease every
/// quarter of this; the default (40 s) would be 500 writes a second at
/// 5,000 nodes. Nothing here reads node Leases.
const LEASE_SECONDS: u32 = 3600;

impl ControlPlane {
    /// Starts the kwok controller for the nodes annotated [`ANNOTATION`]`=fake`.
    pub fn start_kwok(&self) -> Result<(), Error> {
        let config = self.dir.join("kwok.yaml");
        std::fs::write(&config, STAGES).map_err(Error::io("write", &config))?;
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig().display()),
            format!("--config={}", config.display()),
            "--manage-all-nodes=false".to_owned(),
            format!("--manage-nodes-with-annotation-selector={ANNOTATION}=fake"),
            format!("--node-lease-duration-seconds={LEASE_SECONDS}"),
            "--v=WARN".to_owned(),
        ];
        self.spawn("kwok", &tools::binary("kwok")?, &args)
    }
}
