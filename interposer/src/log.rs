//! Logging to stderr, gated by `LIBCUDA_LOG_LEVEL` (HAMi's levels: 0 and 1
//! errors only, 2 warnings (default), 3 info, 4 debug).

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// Always printed.
pub(crate) const ERROR: u8 = 0;
/// Printed from level 2 (the default).
pub(crate) const WARN: u8 = 2;
/// Printed from level 3.
pub(crate) const INFO: u8 = 3;
/// Printed from level 4.
pub(crate) const DEBUG: u8 = 4;

static LEVEL: AtomicU8 = AtomicU8::new(WARN);

/// Sets the level (done once, when the configuration is read).
pub(crate) fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
}

/// Whether messages of `level` are printed.
pub(crate) fn enabled(level: u8) -> bool {
    level <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one line to stderr with a single `write(2)`, so lines of
/// concurrent processes do not interleave.
pub(crate) fn write(level: u8, args: fmt::Arguments<'_>) {
    let label = match level {
        ERROR => "ERROR",
        WARN => "WARN",
        INFO => "INFO",
        _ => "DEBUG",
    };
    let line = format!(
        "[tessera-vgpu pid {}] {label}: {args}\n",
        std::process::id()
    );
    let mut bytes = line.as_bytes();
    while !bytes.is_empty() {
        // SAFETY: writing an initialised buffer of the given length to fd 2.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            break;
        }
        bytes = &bytes[n.unsigned_abs()..];
    }
}

/// `log!(level, "format", args..)`: formats only when the level is enabled.
macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        if $crate::log::enabled($level) {
            $crate::log::write($level, format_args!($($arg)*));
        }
    };
}
