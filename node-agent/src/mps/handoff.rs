//! The GPUs that want an MPS control daemon, handed from the agent to the
//! MPS host (`tessera-node-agent mps-daemons`) through one file in the
//! agent's state directory: `<state>/mps/daemons`, a GPU UUID per line.
//!
//! The file is what lets the daemons outlive the agent: the agent rewrites
//! it (atomically, by rename) when the GPUs it offers in MPS mode change,
//! and the host, a process of its own pod, keeps a daemon for each line
//! whether the agent runs or not. An agent that restarts writes the same
//! lines and nothing changes for the clients.
//!
//! Only root on the node writes `<state>/mps/`: containers get its `shm`
//! directory and each daemon's `pipe` and `log`, never the directory
//! itself. The host still reads the file as untrusted: a symlink is
//! refused, at most [`MAX_BYTES`] are read, and each line must name one
//! directory ([`super::MpsManager::daemon`] checks).

use std::{
    collections::BTreeSet,
    io::Read,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use crate::Error;

/// The file's name under the MPS root.
pub const FILE: &str = "daemons";
/// The most the host reads (a UUID is 40 bytes; a node has a few GPUs).
pub const MAX_BYTES: u64 = 64 * 1024;

/// The hand-off file under `root` (`<state>/mps`).
pub fn path(root: &Path) -> PathBuf {
    root.join(FILE)
}

/// Writes `wanted` for the host: a temporary file renamed over the last,
/// so the host never reads half a list. Returns whether the file changed.
pub fn write(root: &Path, wanted: &BTreeSet<String>) -> Result<bool, Error> {
    let path = path(root);
    let text: String = wanted.iter().map(|uuid| format!("{uuid}\n")).collect();
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    std::fs::create_dir_all(root).map_err(Error::io(format!("creating {}", root.display())))?;
    let temp = root.join(format!(".{FILE}.tmp"));
    std::fs::write(&temp, &text).map_err(Error::io(format!("writing {}", temp.display())))?;
    std::fs::rename(&temp, &path).map_err(Error::io(format!("renaming to {}", path.display())))?;
    Ok(true)
}

/// The GPUs the agent last handed over; none when it never wrote the file.
pub fn read(root: &Path) -> Result<BTreeSet<String>, Error> {
    let path = path(root);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => {
            return Err(Error::io(format!(
                "opening {} (a symlink?)",
                path.display()
            ))(e));
        }
    };
    let regular = file.metadata().is_ok_and(|m| m.is_file());
    if !regular {
        return Err(Error::Mps(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    let mut text = String::new();
    file.take(MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(Error::io(format!("reading {}", path.display())))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(Error::Mps(format!(
            "{} is longer than {MAX_BYTES} bytes: not the agent's list",
            path.display()
        )));
    }
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_round_trips_and_an_unchanged_list_is_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mps");
        assert!(read(&root).unwrap().is_empty(), "never written: none");
        let wanted: BTreeSet<String> = ["GPU-a".to_owned(), "GPU-b".to_owned()].into();
        assert!(write(&root, &wanted).unwrap());
        assert!(!write(&root, &wanted).unwrap());
        assert_eq!(read(&root).unwrap(), wanted);
        assert!(write(&root, &BTreeSet::new()).unwrap());
        assert!(read(&root).unwrap().is_empty());
    }

    #[test]
    fn a_symlink_or_an_oversized_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mps");
        std::fs::create_dir_all(&root).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "GPU-a\n").unwrap();
        std::os::unix::fs::symlink(&elsewhere, path(&root)).unwrap();
        let error = read(&root).unwrap_err().to_string();
        assert!(error.contains("a symlink?"), "{error}");
        std::fs::remove_file(path(&root)).unwrap();
        std::fs::write(path(&root), "G".repeat(MAX_BYTES as usize + 1)).unwrap();
        let error = read(&root).unwrap_err().to_string();
        assert!(error.contains("longer than"), "{error}");
    }
}
