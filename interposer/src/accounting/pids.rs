//! Process ids as the driver reports them: those of the host's pid
//! namespace, which a containerised process learns from its region slot.

use std::sync::OnceLock;

/// `PROC_PID_INIT_INO`: the inode of the initial (host) pid namespace.
const INIT_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Whether this process runs in the host's pid namespace, where its pids are
/// the ones the driver reports.
pub(crate) fn in_host_pid_namespace() -> bool {
    static HOST: OnceLock<bool> = OnceLock::new();
    *HOST.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .is_ok_and(|link| link.as_os_str() == INIT_PID_NAMESPACE)
    })
}
