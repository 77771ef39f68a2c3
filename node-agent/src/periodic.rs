//! Passes that run on a timer for the life of the process.

use std::{sync::Arc, time::Duration};

/// Runs `pass` (named `name`) on a blocking thread every `period`, one
/// pass at a time (a slow pass delays the next instead of piling up), for
/// as long as the returned future is polled. A pass that panics is logged
/// by name and the next one runs: each pass starts from the node's state.
pub(crate) async fn every(
    name: &'static str,
    period: Duration,
    pass: impl Fn() + Send + Sync + 'static,
) {
    let pass = Arc::new(pass);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let pass = pass.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || pass()).await {
            tracing::error!(pass = name, %error, "a periodic pass failed; the next one runs as usual");
        }
    }
}
