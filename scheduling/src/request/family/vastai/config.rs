//! HAMi's `vastai:` section.

use serde::{Deserialize, Serialize};

/// HAMi's `vastai:` section: Vastai accelerators, whose plugin registers
/// them in `hami.io/node-va-register`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct VastaiConfig {
    /// Number of devices (`vastaitech.com/va`): whole cards, or dies where
    /// the plugin registers dies.
    pub resource_count_name: String,
}

impl Default for VastaiConfig {
    /// HAMi's chart default (`values.yaml`, `vastaiResourceName`).
    fn default() -> Self {
        Self {
            resource_count_name: "vastaitech.com/va".into(),
        }
    }
}
