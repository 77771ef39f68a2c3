//! What the profile routes answer with.

/// A profile as Go's `net/http/pprof` serves it: an attachment named `name`.
pub(crate) fn attachment(name: &'static str, bytes: Vec<u8>) -> axum::response::Response {
    use axum::{http::header, response::IntoResponse};
    let disposition = format!("attachment; filename=\"{name}\"");
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        bytes,
    )
        .into_response()
}
