//! Other vendors' devices (HAMi's heterogeneous half): what their own device
//! plugins report on Nodes, turned into GpuNodes the extender schedules from,
//! and what those plugins read back from pods at Bind.
//!
//! - [`register`]: HAMi's register annotations, decoded with every bound checked.
//! - [`view`]: a Node's annotations to a GpuNode status, with HAMi's handshake.
//! - [`nodes`]: the controller that keeps vendor GpuNodes current (leader only).
//!
//! Pure logic lives in `register` and `view`; only `nodes` talks to the API
//! server. What a vendor plugin reads at Allocate is each family's
//! [`Family::hand_off`](tessera_scheduling::request::Family::hand_off),
//! which Bind writes.

pub(crate) mod nodes;
pub mod register;
pub mod view;

pub use tessera_scheduling::request::Source;
pub use view::{VendorView, sources};

/// The label on GpuNodes the controller writes from vendor annotations
/// (value `vendor-plugin`); GpuNodes without it are the node agent's.
pub const SOURCE_LABEL: &str = "tessera.dev/gpunode-source";
/// [`SOURCE_LABEL`]'s value.
pub const VENDOR_PLUGIN: &str = "vendor-plugin";

/// What the vendor-node controller reads from the configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    /// Every configured source.
    pub sources: Vec<Source>,
    /// Whether Ascend nodes run hami-vnpu-core unless their Node says otherwise.
    pub soft_split_default: bool,
}

impl Sources {
    /// The sources `config` turns on.
    pub fn of(config: &tessera_scheduling::request::RequestConfig) -> Self {
        Self {
            sources: sources(config),
            soft_split_default: config.vnpus.as_ref().is_some_and(|v| v.hami_vnpu_core),
        }
    }
}
