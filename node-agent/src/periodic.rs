//! Passes that run on a timer for the life of the process.

use std::{sync::Arc, time::Duration};

/// Runs `pass` on a blocking thread every `period`, one pass at a time (a
/// slow pass delays the next instead of piling up).
pub(crate) fn every(period: Duration, pass: impl Fn() + Send + Sync + 'static) {
    let pass = Arc::new(pass);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let pass = pass.clone();
            let _ = tokio::task::spawn_blocking(move || pass()).await;
        }
    });
}
