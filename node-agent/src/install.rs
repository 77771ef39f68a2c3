//! Installing the interposer from the agent's image onto the host path that
//! Allocate mounts into GPU containers (`--install-interposer-from`).
//!
//! Running containers have the installed library mapped, so it is never
//! rewritten in place: the new contents go to a temporary file in the same
//! directory, which is synced and renamed over the old one. Processes that
//! have the old file open or mapped keep its contents (the old inode lives
//! until they let go); containers started afterwards mount the new one.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::Error;

/// Permissions of the installed library: every container user reads it.
const MODE: u32 = 0o755;

/// Permissions of a container's limits file and of the preload list: every
/// container user reads them.
const LIMITS_MODE: u32 = 0o644;

/// Creates a hami-core container's region directory (which the container
/// writes) and its limits directory with the limits file for the limit
/// variables among `envs` (which the container only reads: it is mounted
/// read-only, so the container cannot loosen its own limits). The file is
/// replaced atomically; an existing region directory is kept.
///
/// The file is in place when this returns (a container started now reads
/// it) but not yet on disk: two syncs cost milliseconds on the kubelet's
/// Allocate path. Returns its path, for [`sync_in_place`] once the kubelet
/// has its answer and before the container is recorded as served.
pub fn prepare_container_dirs(
    paths: &crate::contract::HostPaths,
    region_dir: &Path,
    envs: &std::collections::BTreeMap<String, String>,
) -> Result<PathBuf, Error> {
    fs::create_dir_all(region_dir).map_err(Error::io(format!(
        "creating the region directory {}",
        region_dir.display()
    )))?;
    let file = paths
        .limits_dir(region_dir)
        .join(tessera_api::env::LIMITS_FILE_NAME);
    let text = tessera_api::env::format_limits_file(
        envs.iter()
            .map(|(name, value)| (name.as_str(), value.as_str())),
    );
    put_in_place(&file, text.as_bytes(), LIMITS_MODE, false).map_err(step_failed(&file))?;
    Ok(file)
}

/// Makes a file [`prepare_container_dirs`] put in place durable: the file's
/// contents, then its name in its directory.
pub fn sync_in_place(file: &Path) -> Result<(), Error> {
    File::open(file)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(format!("syncing {}", file.display())))?;
    sync_directory_of(file).map_err(step_failed(file))
}

/// The error of a failed step of [`replace`] or [`put_in_place`] on
/// `file`, naming the step.
pub(crate) fn step_failed(file: &Path) -> impl FnOnce((&'static str, std::io::Error)) -> Error {
    let file = file.display().to_string();
    move |(action, source)| Error::io(format!("{action} {file}"))(source)
}

/// What [`install_interposer`] or [`install_preload`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    /// The file was written (it was missing or different).
    Copied,
    /// The file already had the same contents; nothing was written.
    AlreadyCurrent,
}

/// Copies `from` to `to` atomically, unless `to` already holds the same
/// bytes; creates `to`'s directory when missing.
pub fn install_interposer(from: &Path, to: &Path) -> Result<Installed, Error> {
    let failed = |action: &str| {
        let action = action.to_owned();
        move |source: std::io::Error| Error::InstallInterposer {
            from: from.to_owned(),
            to: to.to_owned(),
            action,
            source,
        }
    };
    let contents = fs::read(from).map_err(failed("reading the source"))?;
    install(to, &contents, MODE).map_err(|(action, source)| failed(action)(source))
}

/// Replaces `to` with `contents` ([`replace`]) unless it already holds
/// exactly them, in which case the file (and its inode) is left alone.
fn install(
    to: &Path,
    contents: &[u8],
    mode: u32,
) -> Result<Installed, (&'static str, std::io::Error)> {
    if fs::read(to).is_ok_and(|current| current == contents) {
        return Ok(Installed::AlreadyCurrent);
    }
    replace(to, contents, mode)?;
    Ok(Installed::Copied)
}

/// Puts the preload list the agent mounts into every served container
/// (`/etc/ld.so.preload`: one line, [`crate::contract::CONTAINER_LIBRARY`])
/// at `to`, unless it is already there.
///
/// Never rewritten in place: the file is bind-mounted into running
/// containers, which share its inode, and a process that starts in any of
/// them while it is empty (truncated, not yet written) runs without the
/// interposer, with no memory or compute limit. An agent restarting next to
/// running GPU containers did exactly that. Same contents: untouched; other
/// contents: a new file renamed over it (containers already running keep
/// the one they mounted).
pub fn install_preload(to: &Path) -> Result<Installed, Error> {
    let contents = format!("{}\n", crate::contract::CONTAINER_LIBRARY);
    install(to, contents.as_bytes(), LIMITS_MODE).map_err(step_failed(to))
}

/// Replaces `to` with `contents` (mode `mode`) atomically and durably:
/// written and synced beside it, renamed over it, the directory synced;
/// creates the directory when missing. A reader sees the old file or the
/// new one, never part of one. On failure, names the step that failed.
pub(crate) fn replace(
    to: &Path,
    contents: &[u8],
    mode: u32,
) -> Result<(), (&'static str, std::io::Error)> {
    put_in_place(to, contents, mode, true)?;
    sync_directory_of(to)
}

/// Writes `contents` beside `to` (synced first when `synced`) and renames it
/// over `to`, creating the directory when missing: readers see the old file
/// or the new one, never part of one.
fn put_in_place(
    to: &Path,
    contents: &[u8],
    mode: u32,
    synced: bool,
) -> Result<(), (&'static str, std::io::Error)> {
    let dir = directory_of(to)?;
    fs::create_dir_all(dir).map_err(|e| ("creating the target's directory", e))?;
    let temporary = temporary_path(to);
    let written = write_new(&temporary, contents, mode, synced)
        .and_then(|()| fs::rename(&temporary, to))
        .map_err(|e| ("writing the new file and renaming it over the target", e));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}

/// Makes a rename into `to`'s directory durable.
fn sync_directory_of(to: &Path) -> Result<(), (&'static str, std::io::Error)> {
    File::open(directory_of(to)?)
        .and_then(|d| d.sync_all())
        .map_err(|e| ("syncing the target's directory", e))
}

fn directory_of(to: &Path) -> Result<&Path, (&'static str, std::io::Error)> {
    to.parent().filter(|d| !d.as_os_str().is_empty()).ok_or((
        "finding the target's directory",
        std::io::Error::other("the target has no directory"),
    ))
}

/// A name beside `to` that no other process uses: `.<name>.<pid>.tmp`.
fn temporary_path(to: &Path) -> PathBuf {
    let name = to.file_name().unwrap_or_default().to_string_lossy();
    to.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

fn write_new(path: &Path, contents: &[u8], mode: u32, synced: bool) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    file.write_all(contents)?;
    // The umask may have narrowed the mode given at creation.
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    if synced {
        file.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{io::Read, os::unix::fs::MetadataExt};

    use super::*;

    #[test]
    fn a_container_gets_its_region_directory_and_a_limits_file_of_its_limits_only() {
        let dir = tempfile::tempdir().unwrap();
        let paths = crate::contract::HostPaths {
            library: dir.path().join("lib.so"),
            preload: dir.path().join("preload"),
            regions: dir.path().join("containers"),
            limits: dir.path().join("limits"),
        };
        let region = paths.regions.join("uid-1_main");
        let envs = |memory: &str| -> std::collections::BTreeMap<String, String> {
            [
                ("CUDA_DEVICE_MEMORY_LIMIT_0", memory),
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("LIBCUDA_LOG_LEVEL", "2"),
                ("NVIDIA_VISIBLE_DEVICES", "GPU-1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
        };
        let placed = prepare_container_dirs(&paths, &region, &envs("4096m")).unwrap();
        assert!(region.is_dir());
        let file = dir.path().join("limits/uid-1_main/limits.env");
        assert_eq!(placed, file);
        sync_in_place(&placed).unwrap();
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "CUDA_DEVICE_MEMORY_LIMIT_0=4096m\nCUDA_DEVICE_SM_LIMIT=30\n"
        );
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o644);
        // A second Allocate for the same container replaces the file whole.
        prepare_container_dirs(&paths, &region, &envs("2048m")).unwrap();
        assert!(
            fs::read_to_string(&file)
                .unwrap()
                .starts_with("CUDA_DEVICE_MEMORY_LIMIT_0=2048m\n")
        );
    }

    #[test]
    fn copies_into_a_new_directory_readable_by_all() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("image/libtessera_vgpu.so");
        fs::create_dir_all(from.parent().unwrap()).unwrap();
        fs::write(&from, b"v1").unwrap();
        let to = dir.path().join("host/usr/local/vgpu/libtessera_vgpu.so");
        assert_eq!(install_interposer(&from, &to).unwrap(), Installed::Copied);
        assert_eq!(fs::read(&to).unwrap(), b"v1");
        assert_eq!(fs::metadata(&to).unwrap().mode() & 0o777, MODE);
        let left: Vec<_> = fs::read_dir(to.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["libtessera_vgpu.so"], "no temporary file is left");
    }

    #[test]
    fn identical_contents_are_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("src.so"), dir.path().join("dst.so"));
        fs::write(&from, b"same").unwrap();
        fs::write(&to, b"same").unwrap();
        let inode = fs::metadata(&to).unwrap().ino();
        assert_eq!(
            install_interposer(&from, &to).unwrap(),
            Installed::AlreadyCurrent
        );
        assert_eq!(fs::metadata(&to).unwrap().ino(), inode, "the same file");
    }

    #[test]
    fn replacing_keeps_what_an_open_descriptor_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("src.so"), dir.path().join("dst.so"));
        fs::write(&to, b"old library").unwrap();
        let mut open = File::open(&to).unwrap(); // a running container's mapping
        fs::write(&from, b"new").unwrap();
        assert_eq!(install_interposer(&from, &to).unwrap(), Installed::Copied);
        let mut seen = String::new();
        open.read_to_string(&mut seen).unwrap();
        assert_eq!(seen, "old library", "the old file was not truncated");
        assert_eq!(fs::read(&to).unwrap(), b"new");
    }

    #[test]
    fn the_preload_list_a_container_mounted_is_never_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("state/ld.so.preload");
        assert_eq!(install_preload(&to).unwrap(), Installed::Copied);
        let line = format!("{}\n", crate::contract::CONTAINER_LIBRARY);
        assert_eq!(fs::read_to_string(&to).unwrap(), line);
        assert_eq!(fs::metadata(&to).unwrap().mode() & 0o777, 0o644);
        // A container's bind mount is the inode: a restarted agent leaves it be.
        let mounted = fs::metadata(&to).unwrap().ino();
        for _ in 0..3 {
            assert_eq!(install_preload(&to).unwrap(), Installed::AlreadyCurrent);
        }
        assert_eq!(fs::metadata(&to).unwrap().ino(), mounted);
        // Other contents (an older agent's): replaced by a new file, while a
        // container holding the old one still reads it whole.
        fs::write(&to, "/old/libvgpu.so\n").unwrap();
        let mut open = File::open(&to).unwrap();
        assert_eq!(install_preload(&to).unwrap(), Installed::Copied);
        let mut seen = String::new();
        open.read_to_string(&mut seen).unwrap();
        assert_eq!(
            seen, "/old/libvgpu.so\n",
            "the mounted file was not truncated"
        );
        assert_eq!(fs::read_to_string(&to).unwrap(), line);
    }

    #[test]
    fn failures_name_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("missing.so");
        let to = dir.path().join("dst.so");
        let error = install_interposer(&from, &to).unwrap_err().to_string();
        assert!(error.contains(&from.display().to_string()), "{error}");
        assert!(error.contains(&to.display().to_string()), "{error}");
        assert!(error.contains("reading the source"), "{error}");

        // The target's directory cannot be created: a file is in the way.
        fs::write(&from, b"v1").unwrap();
        let blocked = dir.path().join("file/libtessera_vgpu.so");
        fs::write(dir.path().join("file"), b"").unwrap();
        let error = install_interposer(&from, &blocked).unwrap_err().to_string();
        assert!(error.contains("creating the target's directory"), "{error}");
        assert!(error.contains(&blocked.display().to_string()), "{error}");
    }
}
