//! Is the process that owns a slot still there?

use std::io;

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), or `None` when the process does not exist.
pub fn process_start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.start_time()
}

/// Whether `pid` is a live (not zombie) process that started at `start_time`.
///
/// A pid that now belongs to a process with another start time is dead for
/// the region: its previous owner exited and the pid was reused.
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    if unsafe { libc::kill(raw, 0) } != 0
        && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    match stat_fields(pid) {
        Some(stat) => !stat.is_zombie() && stat.start_time() == Some(start_time),
        // Exists (kill said so) but /proc is unreadable: assume alive rather
        // than steal a live process's reservations.
        None => true,
    }
}

/// The fields of `/proc/<pid>/stat` after the command name.
struct Stat(String);

fn stat_fields(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything,
    // including spaces and ')'; the fields after the last ')' are fixed.
    let rest = &text[text.rfind(')')? + 1..];
    Some(Stat(rest.trim().to_owned()))
}

impl Stat {
    /// Field 3, the state letter.
    fn is_zombie(&self) -> bool {
        matches!(self.0.split_whitespace().next(), Some("Z" | "X" | "x"))
    }

    /// Field 22.
    fn start_time(&self) -> Option<u64> {
        self.0.split_whitespace().nth(22 - 3)?.parse().ok()
    }
}
