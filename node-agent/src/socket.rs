//! The kubelet's sockets: which file a path is now, so that a restarted
//! kubelet (a new socket) is noticed and registered with again.

use std::{os::unix::fs::MetadataExt, path::Path};

/// Identifies one incarnation of a file (a re-created socket differs).
pub(crate) fn identity(path: &Path) -> Option<(u64, u64, i64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime_nsec()))
}
