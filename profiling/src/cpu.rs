//! `/debug/pprof/profile`: a CPU profile of the whole process.
//!
//! pprof-rs samples every thread on `SIGPROF` (`setitimer`), 100 times a
//! second, and unwinds each sample; the report is encoded as pprof's
//! `Profile` protobuf with function names, which `go tool pprof` reads as it
//! reads Go's. One profile at a time: the timer is process-wide.

use std::time::Duration;

use axum::{
    extract::Query,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use pprof::protos::Message;
use serde::Deserialize;
use tokio::sync::Mutex;

/// Samples per second, as Go's runtime takes them.
pub const FREQUENCY: i32 = 100;
/// The profile's length when `seconds` is not given (Go's default).
pub const DEFAULT_SECONDS: u64 = 30;
/// The longest profile served.
pub const MAX_SECONDS: u64 = 300;

/// Held while a profile is being taken.
static RUNNING: Mutex<()> = Mutex::const_new(());

/// The query of `/debug/pprof/profile`.
#[derive(Debug, Deserialize)]
pub struct ProfileQuery {
    /// How long to sample, in whole seconds.
    pub seconds: Option<String>,
}

/// Reads `seconds` as Go's handler does, naming the field and the rule
/// when it is wrong.
pub fn seconds(query: &ProfileQuery) -> Result<Duration, String> {
    let Some(text) = &query.seconds else {
        return Ok(Duration::from_secs(DEFAULT_SECONDS));
    };
    match text.parse::<u64>() {
        Ok(n) if (1..=MAX_SECONDS).contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(format!(
            "seconds={text:?}: must be a whole number of seconds from 1 to {MAX_SECONDS}\n"
        )),
    }
}

/// Samples the process for `length` and encodes the profile.
pub fn profile(length: Duration) -> Result<Vec<u8>, pprof::Error> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    std::thread::sleep(length);
    let profile = guard.report().build()?.pprof()?;
    Ok(profile.encode_to_vec())
}

pub(crate) async fn handler(Query(query): Query<ProfileQuery>) -> Response {
    let length = match seconds(&query) {
        Ok(length) => length,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let Ok(_running) = RUNNING.try_lock() else {
        return (
            StatusCode::CONFLICT,
            "a CPU profile is already being taken; try again when it is done\n",
        )
            .into_response();
    };
    let taken = tokio::task::spawn_blocking(move || profile(length))
        .await
        .map_err(|joined| joined.to_string())
        .and_then(|profiled| profiled.map_err(|error| error.to_string()));
    match taken {
        Ok(bytes) => crate::response::attachment("profile", bytes),
        Err(error) => {
            tracing::warn!(%error, "CPU profile failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("CPU profile failed: {error}\n"),
            )
                .into_response()
        }
    }
}
