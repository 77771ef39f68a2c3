//! HAMi's `biren:` section.

use serde::{Deserialize, Serialize};

/// HAMi's `biren:` section: Biren GPUs, served by HAMi's
/// biren-device-plugin, which registers them in
/// `hami.io/node-biren-register`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct BirenConfig {
    /// Number of GPUs (`birentech.com/gpu`).
    pub resource_count_name: String,
}

impl Default for BirenConfig {
    /// HAMi's chart default (`values.yaml`, `birenResourceName`).
    fn default() -> Self {
        Self {
            resource_count_name: "birentech.com/gpu".into(),
        }
    }
}
