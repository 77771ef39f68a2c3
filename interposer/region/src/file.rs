//! The node agent's access to a container's region: [`RegionFile`].
//!
//! The region directory is mounted writable into the container, so every
//! byte, the size, the type and the very identity of the file named
//! `region` in it are the tenant's. The interposer maps the file (its
//! processes share counters through atomics); the agent must not, because a
//! shared mapping of a file someone else can truncate turns every access
//! into a possible `SIGBUS`, which kills the whole agent (measured: a pod
//! that alternately truncated and restored its region killed the agent in
//! seconds). So the agent:
//!
//! 1. opens the container's directory (which it created, under its own state
//!    directory) with `O_PATH | O_DIRECTORY | O_NOFOLLOW`, then the region
//!    *relative to that descriptor* with `openat(O_PATH | O_NOFOLLOW)`. The
//!    name is one path component (checked), so no path resolution happens
//!    beyond that one name and `O_NOFOLLOW` refuses a symbolic link there:
//!    what `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` would add (no
//!    `..`, no intermediate links) cannot occur with a single component. An
//!    `O_PATH` descriptor opens nothing: a FIFO does not block, a device node
//!    the tenant made with `mknod` (a watchdog, a tape, a tty) sees no
//!    `open` and has no side effect;
//! 2. checks that descriptor with `fstat`: a regular file, exactly one link
//!    (a hard link is another name of a file that is used elsewhere), exactly
//!    [`REGION_SIZE`] bytes (a sparse multi-gigabyte file or a truncated one
//!    is refused before anything is read);
//! 3. only then opens the file for reading and writing, through
//!    `/proc/self/fd/<n>` of the checked descriptor: the same inode, whatever
//!    the tenant renamed in between. `O_NONBLOCK` makes the open fail
//!    (`EWOULDBLOCK`) instead of waiting when the tenant holds a lease on the
//!    file (`F_SETLEASE` would otherwise hold the agent's open for the
//!    lease-break time, 45 s by default); `O_NOCTTY` and `O_CLOEXEC` as usual;
//! 4. reads the whole region with `pread` into a buffer of [`REGION_SIZE`]
//!    bytes: the file shrinking while it is read is a short read (an error),
//!    growing is ignored (nothing past the region is read);
//! 5. parses the bytes ([`Snapshot::parse`]): the header must declare exactly
//!    this crate's version, sizes and counts; every count and size used is
//!    this crate's constant, never a number from the file, so nothing the
//!    file says can size an allocation or a loop;
//! 6. writes the few fields the agent owns (sharing marks, holds, host pids)
//!    with `pwrite` of 4 or 8 bytes at fixed, naturally aligned offsets of
//!    the same descriptor, after another `fstat` finds the size still right.
//!    A file truncated in between grows by at most those bytes (still below
//!    [`REGION_SIZE`]); nothing the tenant does turns a write into a signal.
//!    The interposer reads these fields with relaxed atomic loads of its
//!    mapping; an aligned `pwrite` of one word lands in the page cache as one
//!    copy, as a store would.
//!
//! What the agent trusts from a region: nothing that decides anything for
//! another container. Limits and priorities come from the container's
//! `VgpuAllocation`; the numbers read here (memory used, launch times, pids)
//! are what the container *claims* and are used only for the container's own
//! metrics and for its own region's host pids.

use std::fs::File;
use std::io;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::region::{
    DeviceRecord, Error, Header, Layout, REGION_SIZE, Result, Sharing, SlotId, SlotRecord,
};
use crate::snapshot::Snapshot;

/// A container's region file, opened and checked as the module docs say.
/// Holds no mapping: every read is a `pread`, every write a `pwrite`.
#[derive(Debug)]
pub struct RegionFile {
    file: File,
    path: PathBuf,
    id: (u64, u64),
}

impl RegionFile {
    /// Opens the region `name` (one path component) in the directory `dir`,
    /// refusing anything but a regular file of [`REGION_SIZE`] bytes with
    /// one link. Errors name the path and the rule.
    pub fn open_beneath(dir: &Path, name: &str) -> Result<Self> {
        let path = dir.join(name);
        let io = |op: &'static str| {
            let path = path.clone();
            move |source| Error::Io { path, op, source }
        };
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::Name { path });
        }
        let dir_fd = open_at(
            libc::AT_FDCWD,
            dir.as_os_str().as_bytes(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
        .map_err(io("open the directory of"))?;
        let handle = open_at(
            dir_fd.as_raw_fd(),
            name.as_bytes(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
        .map_err(io("open"))?;
        let checked = fstat(&handle).map_err(io("stat"))?;
        check_stat(&path, &checked)?;
        // Reopen the checked inode itself (the magic link of an O_PATH
        // descriptor names that inode, not a path the tenant can change).
        let proc_path = format!("/proc/self/fd/{}", handle.as_raw_fd());
        let fd = open_at(
            libc::AT_FDCWD,
            proc_path.as_bytes(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
        .map_err(io("reopen"))?;
        let file = File::from(fd);
        let opened = file.metadata().map_err(io("stat"))?;
        if (opened.dev(), opened.ino()) != (checked.st_dev, checked.st_ino) {
            return Err(Error::Replaced { path });
        }
        Ok(Self {
            file,
            path,
            id: (opened.dev(), opened.ino()),
        })
    }

    /// The region's path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's (device, inode), as checked when it was opened.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// Reads and parses the whole region: exactly [`REGION_SIZE`] bytes
    /// with `pread`, a short read being an error.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut bytes = vec![0u8; REGION_SIZE];
        let mut read = 0;
        while read < REGION_SIZE {
            match self.file.read_at(&mut bytes[read..], read as u64) {
                Ok(0) => {
                    return Err(Error::ShortRead {
                        path: self.path.clone(),
                        read,
                    });
                }
                Ok(n) => read += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(Error::Io {
                        path: self.path.clone(),
                        op: "read",
                        source,
                    });
                }
            }
        }
        Snapshot::parse(&bytes, &self.path)
    }

    /// Marks device `dev` shared or exclusive; ordinals beyond
    /// [`crate::region::MAX_DEVICES`] are ignored.
    pub fn set_sharing(&self, dev: usize, sharing: Sharing) -> Result<()> {
        if dev >= crate::region::MAX_DEVICES {
            return Ok(());
        }
        let at = offset_of!(Layout, devices)
            + dev * size_of::<DeviceRecord>()
            + offset_of!(DeviceRecord, sharing);
        self.write(at, &sharing.raw().to_ne_bytes())
    }

    /// Holds launches on the ordinals of `devices` until `until` (`devices`
    /// 0 releases them), the deadline first as [`crate::region::Region::set_hold`].
    pub fn set_hold(&self, devices: u32, until: u64) -> Result<()> {
        if devices != 0 {
            self.write(offset_of!(Header, hold_until), &until.to_ne_bytes())?;
        }
        self.write(offset_of!(Header, held_devices), &devices.to_ne_bytes())
    }

    /// Records the host pid of a slot's process.
    pub fn set_host_pid(&self, slot: SlotId, host_pid: u32) -> Result<()> {
        let at = offset_of!(Layout, slots)
            + slot.index() * size_of::<SlotRecord>()
            + offset_of!(SlotRecord, host_pid);
        self.write(at, &host_pid.to_ne_bytes())
    }

    fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let io = |op| {
            move |source| Error::Io {
                path: self.path.clone(),
                op,
                source,
            }
        };
        let len = self.file.metadata().map_err(io("stat"))?.len();
        if len != REGION_SIZE as u64 {
            return Err(Error::Size {
                path: self.path.clone(),
                found: len,
            });
        }
        self.file
            .write_all_at(bytes, offset as u64)
            .map_err(io("write"))
    }
}

/// `openat(2)`, retried on `EINTR`.
fn open_at(dir: libc::c_int, path: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(path).map_err(|_| io::ErrorKind::InvalidInput)?;
    loop {
        // SAFETY: `path` is a NUL-terminated string that outlives the call;
        // `dir` is AT_FDCWD or a descriptor the caller owns; no mode is
        // needed without O_CREAT.
        let fd = unsafe { libc::openat(dir, path.as_ptr(), flags) };
        if fd >= 0 {
            // SAFETY: openat returned a new descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `fstat(2)` of a descriptor (an `O_PATH` one included).
fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of a plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the struct it is given; the descriptor is
    // owned by `fd` and open for the duration of the call.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

/// The rules of step 2 of the module docs.
fn check_stat(path: &Path, stat: &libc::stat) -> Result<()> {
    let kind = match stat.st_mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFLNK => Some("symbolic link"),
        libc::S_IFDIR => Some("directory"),
        libc::S_IFIFO => Some("FIFO"),
        libc::S_IFSOCK => Some("socket"),
        libc::S_IFCHR => Some("character device"),
        libc::S_IFBLK => Some("block device"),
        _ => Some("file of unknown type"),
    };
    if let Some(kind) = kind {
        return Err(Error::NotAFile {
            path: path.to_owned(),
            kind,
        });
    }
    if stat.st_nlink != 1 {
        // `nlink_t` is u64 on x86_64 and u32 on some other targets.
        #[allow(clippy::unnecessary_cast)]
        let links = stat.st_nlink as u64;
        return Err(Error::Links {
            path: path.to_owned(),
            links,
        });
    }
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size != REGION_SIZE as u64 {
        return Err(Error::Size {
            path: path.to_owned(),
            found: size,
        });
    }
    Ok(())
}
