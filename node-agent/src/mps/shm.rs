//! The `/dev/shm` MPS daemons and their clients share (`<state>/mps/shm`):
//! a tmpfs of a fixed size, mounted by the MPS host's init container
//! (`tessera-node-agent mps-daemons --mount-shm`), as NVIDIA's MPS control
//! daemon mounts its own. Every MPS tenant of the node writes there, so a
//! directory on the node's disk would let one of them fill that disk; a
//! tenant that fills the tmpfs gets `ENOSPC` and the node loses at most its
//! size in memory.
//!
//! The MPS host checks the mount before it starts a daemon
//! ([`check`]): a daemon never runs on an unbounded `/dev/shm`.

use std::{os::unix::fs::MetadataExt, path::Path};

use nix::{
    mount::{MsFlags, mount},
    sys::statfs::{TMPFS_MAGIC, statfs},
};

use crate::Error;

/// One MiB.
const MIB: u64 = 1 << 20;

/// The mount flags: nothing on the tmpfs runs, is a device or raises
/// privileges (NVIDIA mounts its MPS `/dev/shm` the same way).
fn flags() -> MsFlags {
    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME
}

/// What `dir` is now.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// A tmpfs mounted at `dir` itself, of this many bytes.
    Tmpfs(u64),
    /// A directory that is no tmpfs mount of its own (the node's disk, or
    /// part of a file system mounted above it).
    Directory,
}

/// Mounts a tmpfs of `size_mib` MiB at `dir` (created, mode 1777, when
/// missing), or resizes the one already there; a symlink or a file in its
/// place is refused. Run as root with `dir`'s mount propagated to the host.
pub fn mount_tmpfs(dir: &Path, size_mib: u64) -> Result<(), Error> {
    check_size(size_mib)?;
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    }
    let data = format!("size={size_mib}m,mode=1777");
    let remount = match found(dir)? {
        Found::Tmpfs(bytes) if bytes == size_mib * MIB => {
            tracing::info!(dir = %dir.display(), size_mib, "the MPS shared memory is mounted already");
            return Ok(());
        }
        Found::Tmpfs(_) => MsFlags::MS_REMOUNT,
        Found::Directory => MsFlags::empty(),
    };
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        flags() | remount,
        Some(data.as_str()),
    )
    .map_err(|errno| {
        Error::Mps(format!(
            "mounting a tmpfs of {size_mib} MiB at {} ({data}): {errno} (the MPS host's init container runs privileged, with the state directory mounted Bidirectional; a smaller size than what its clients hold now is refused)",
            dir.display()
        ))
    })?;
    tracing::info!(dir = %dir.display(), size_mib, resized = !remount.is_empty(), "the MPS shared memory is a tmpfs");
    Ok(())
}

/// Succeeds when `dir` is a tmpfs of `size_mib` MiB mounted at `dir`;
/// otherwise says what it is and what mounts it.
pub fn check(dir: &Path, size_mib: u64) -> Result<(), Error> {
    check_size(size_mib)?;
    match found(dir)? {
        Found::Tmpfs(bytes) if bytes == size_mib * MIB => Ok(()),
        Found::Tmpfs(bytes) => Err(Error::Mps(format!(
            "{} is a tmpfs of {} MiB, not the {size_mib} MiB of --shm-size-mib: the MPS host's init container (mps-daemons --mount-shm) resizes it",
            dir.display(),
            bytes / MIB
        ))),
        Found::Directory => Err(Error::Mps(format!(
            "{} is not a tmpfs of its own: MPS clients would share memory on the node's disk without a bound; the MPS host's init container (mps-daemons --mount-shm) mounts it",
            dir.display()
        ))),
    }
}

/// The bound on `--shm-size-mib`: at least 1 MiB, at most 1 TiB.
fn check_size(size_mib: u64) -> Result<(), Error> {
    if (1..=1 << 20).contains(&size_mib) {
        Ok(())
    } else {
        Err(Error::Mps(format!(
            "--shm-size-mib {size_mib}: the MPS shared memory is 1 to 1048576 MiB"
        )))
    }
}

/// Whether `dir` is a tmpfs mount of its own, and its size. A symlink
/// or anything but a directory is refused, never followed.
fn found(dir: &Path) -> Result<Found, Error> {
    let meta =
        std::fs::symlink_metadata(dir).map_err(Error::io(format!("reading {}", dir.display())))?;
    if !meta.is_dir() {
        return Err(Error::Mps(format!(
            "{} is not a directory (a symlink?)",
            dir.display()
        )));
    }
    let parent = dir.parent().unwrap_or(dir);
    let above =
        std::fs::metadata(parent).map_err(Error::io(format!("reading {}", parent.display())))?;
    let stats =
        statfs(dir).map_err(|errno| Error::Mps(format!("statfs of {}: {errno}", dir.display())))?;
    // A mount point is on another device than its parent directory.
    if stats.filesystem_type() == TMPFS_MAGIC && meta.dev() != above.dev() {
        let bytes = stats
            .blocks()
            .saturating_mul(u64::try_from(stats.block_size()).unwrap_or(0));
        Ok(Found::Tmpfs(bytes))
    } else {
        Ok(Found::Directory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_on_the_disk_or_a_symlink_is_no_shared_memory_for_mps() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("shm");
        std::fs::create_dir(&shm).unwrap();
        let error = check(&shm, 64).unwrap_err().to_string();
        assert!(error.contains("not a tmpfs of its own"), "{error}");
        assert!(error.contains("--mount-shm"), "{error}");
        // A tenant's symlink in its place is neither followed nor mounted on.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&shm, &link).unwrap();
        for error in [check(&link, 64), mount_tmpfs(&link, 64)] {
            let error = error.unwrap_err().to_string();
            assert!(error.contains("not a directory (a symlink?)"), "{error}");
        }
        // A file, likewise.
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(check(&file, 64).is_err());
    }

    #[test]
    fn the_size_has_a_bound_named_by_its_flag() {
        for size in [0, (1 << 20) + 1, u64::MAX] {
            let error = check(Path::new("/nonexistent"), size)
                .unwrap_err()
                .to_string();
            assert!(error.contains("--shm-size-mib"), "{error}");
            assert!(error.contains("1 to 1048576 MiB"), "{error}");
        }
    }

    /// Unmounts (lazily) what a test mounted, however the test ends.
    struct Unmount<'a>(&'a Path);

    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    #[test]
    fn the_init_container_mounts_a_bounded_tmpfs_resizes_it_and_the_host_checks_it() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("mps/shm");
        mount_tmpfs(&shm, 8).unwrap();
        let _unmount = Unmount(&shm);
        check(&shm, 8).unwrap();
        let error = check(&shm, 16).unwrap_err().to_string();
        assert!(error.contains("is a tmpfs of 8 MiB"), "{error}");
        // Filling it stops at its size.
        let fill = std::fs::write(shm.join("fill"), vec![0u8; 9 << 20]).unwrap_err();
        assert_eq!(fill.raw_os_error(), Some(libc::ENOSPC), "{fill}");
        std::fs::remove_file(shm.join("fill")).unwrap();
        // Mounting again with the same size changes nothing; another size
        // resizes the same mount (what clients hold stays).
        std::fs::write(shm.join("segment"), b"held").unwrap();
        mount_tmpfs(&shm, 8).unwrap();
        mount_tmpfs(&shm, 16).unwrap();
        check(&shm, 16).unwrap();
        assert_eq!(std::fs::read(shm.join("segment")).unwrap(), b"held");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&shm).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777);
    }
}
