//! Opening a state file that several processes map: created if missing,
//! locked while the first process initialises it, at least the size asked.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;

/// Opens (creating) a state file shared between processes, takes an
/// exclusive `flock` on it (released when the file closes or is unlocked)
/// and makes it at least `size` bytes long.
pub fn open_locked(path: &std::ffi::OsStr, size: usize) -> Result<std::fs::File, String> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.to_string_lossy()))?;
    // SAFETY: flock on a descriptor `file` owns; released when it closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!("cannot lock {}", path.to_string_lossy()));
    }
    if file.metadata().map_err(|e| e.to_string())?.len() < size as u64 {
        file.set_len(size as u64).map_err(|e| e.to_string())?;
    }
    Ok(file)
}

/// Maps `size` bytes shared between processes: of `file` (at least `size`
/// bytes long) or, without one, anonymous memory. It is never unmapped.
pub fn map_shared<T>(file: Option<&File>, size: usize) -> Result<NonNull<T>, String> {
    let (fd, flags) = match file {
        Some(file) => (file.as_raw_fd(), libc::MAP_SHARED),
        None => (-1, libc::MAP_SHARED | libc::MAP_ANONYMOUS),
    };
    // SAFETY: a fresh mapping of `size` bytes, of a file at least that
    // long or anonymous; it is never unmapped.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    NonNull::new(ptr.cast::<T>()).ok_or_else(|| "mmap returned NULL".to_owned())
}
