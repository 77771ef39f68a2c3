//! `/debug/pprof/heap`: the memory in use, from jemalloc's samples.
//!
//! jemalloc records the stack of about one allocation per 512 KiB
//! allocated (`lg_prof_sample:19`) once sampling is switched on, and keeps it
//! until that memory is freed; a dump is what is still held, scaled up to
//! estimate all of it (`inuse_space`), symbolised by `jemalloc_pprof`.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
};
use jemalloc_pprof::PROF_CTL;

/// Switches heap sampling on. Fails when the allocator was built without it
/// (`opt.prof` false: not built with this workspace's `.cargo/config.toml`).
pub async fn activate() -> Result<(), String> {
    let ctl = PROF_CTL.as_ref().ok_or_else(unavailable)?;
    let mut ctl = ctl.lock().await;
    if !ctl.activated() {
        ctl.activate().map_err(|e| format!("prof.active: {e}"))?;
    }
    Ok(())
}

/// Dumps the sampled heap in pprof's format (gzipped protobuf).
pub async fn dump() -> Result<Vec<u8>, String> {
    let ctl = PROF_CTL.as_ref().ok_or_else(unavailable)?;
    let mut ctl = ctl.lock().await;
    if !ctl.activated() {
        return Err("heap sampling is off: start the process with --profiling\n".to_owned());
    }
    tokio::task::block_in_place(|| ctl.dump_pprof()).map_err(|e| format!("heap dump: {e}\n"))
}

fn unavailable() -> String {
    "this binary's jemalloc was built without heap sampling (opt.prof is false)\n".to_owned()
}

pub(crate) async fn handler() -> Response {
    match dump().await {
        Ok(bytes) => crate::response::attachment("heap", bytes),
        Err(message) => (StatusCode::SERVICE_UNAVAILABLE, message).into_response(),
    }
}
