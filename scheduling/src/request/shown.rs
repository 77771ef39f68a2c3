//! Tenant-written values as error messages repeat them: quoted and cut
//! short, so a long value cannot make a denial or an event long too.

/// Longest part of a tenant's value an error message repeats, in bytes.
const SHOWN_BYTES: usize = 64;

/// A tenant's value as an error message repeats it: quoted, and cut to its
/// first [`SHOWN_BYTES`] bytes (at a character boundary) so a long value
/// cannot make the webhook's denial, or an event, long too.
pub(super) fn shown(value: &str) -> String {
    if value.len() <= SHOWN_BYTES {
        return format!("{value:?}");
    }
    format!("{} ({} bytes)", cut(value), value.len())
}

/// `value` quoted, its first [`SHOWN_BYTES`] bytes only (at a character
/// boundary) and an ellipsis when longer.
pub(super) fn cut(value: &str) -> String {
    if value.len() <= SHOWN_BYTES {
        return format!("{value:?}");
    }
    let mut end = SHOWN_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}…", &value[..end])
}
