//! `GET /metrics`, `/healthz` and `/readyz`: served on `--metrics-addr`
//! (what Prometheus and the kubelet's probes reach) and beside the extender's
//! verbs on its loopback address.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};

use super::Metrics;

impl Metrics {
    /// `/metrics`; `/healthz` (the process serves); `/readyz` (the first
    /// lists of GpuNodes and VgpuAllocations are loaded, so Filter and the
    /// webhook answer from a complete inventory).
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/metrics", get(scrape))
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(self)
    }
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if metrics.projection.is_synced() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "GPU inventory still loading",
        )
    }
}
