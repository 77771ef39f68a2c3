//! Whether the kubelet can use the device plugin now: what the agent's
//! `/readyz` and its GpuNode's `Ready` condition report.

/// Whether the kubelet can use the plugin now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginState {
    /// Not registered with the running kubelet (starting, or the kubelet
    /// restarted): the kubelet rejects GPU pods it admits now.
    NotRegistered,
    /// Registered and serving.
    Registered,
    /// The agent is shutting down.
    Stopping,
}
