//! The kernel settings a kubelet changes on start (unless
//! `protectKernelDefaults`, which makes it refuse to start instead): saved
//! before the first node of a process starts and put back when a node stops,
//! so tests and the demo leave the machine as they found it.

use std::sync::OnceLock;

/// What the kubelet's container manager sets (`setupKernelTunables`).
const TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// (setting, value) pairs.
pub(crate) type Saved = Vec<(String, String)>;

fn read() -> Saved {
    TUNABLES
        .iter()
        .filter_map(|name| {
            let value = std::fs::read_to_string(format!("/proc/sys/{name}")).ok()?;
            Some(((*name).to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// The values before this process started any kubelet.
pub(crate) fn original() -> Saved {
    static ORIGINAL: OnceLock<Saved> = OnceLock::new();
    ORIGINAL.get_or_init(read).clone()
}

/// Puts the saved values back (best effort).
pub(crate) fn restore(saved: &Saved) {
    for (name, value) in saved {
        let _ = std::fs::write(format!("/proc/sys/{name}"), value);
    }
}
