//! The kube-scheduler extender over HTTP: `POST /filter`, `/prioritize`, `/bind`.
//!
//! Every verb answers 200 with the extender's JSON; errors travel in the
//! `Error` field, as kube-scheduler expects.

mod bind;
mod filter;
mod lock;
pub mod wire;

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    routing::{get, post},
};
use kube::Client;

pub use bind::{Binder, Bound};
pub use filter::{NO_GPU_NODE, filter, prioritize};
pub use lock::{holder_needs_lock, lock_object};
use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
};

use crate::{config::Config, projection::Projection};

/// What the handlers share.
#[derive(Clone)]
pub struct Extender {
    projection: Projection,
    config: Arc<Config>,
    binder: Binder,
}

impl Extender {
    /// An extender reading `projection` and writing through `client`.
    pub fn new(client: Client, projection: Projection, config: Arc<Config>) -> Self {
        let binder = Binder::new(client, projection.clone(), config.clone());
        Self {
            projection,
            config,
            binder,
        }
    }

    /// The routes: the three verbs plus `/healthz` and `/readyz` (ready once
    /// the projection has its first list).
    pub fn router(self) -> Router {
        Router::new()
            .route("/filter", post(filter_handler))
            .route("/prioritize", post(prioritize_handler))
            .route("/bind", post(bind_handler))
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(self)
    }
}

#[tracing::instrument(name = "filter", skip_all, fields(pod = %pod_name(&args), candidates = args.candidate_names().len(), feasible))]
async fn filter_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderArgs>,
) -> Json<ExtenderFilterResult> {
    let result = filter(&extender.projection, &extender.config, &args);
    let feasible = result
        .node_names
        .as_ref()
        .map(Vec::len)
        .or(result.nodes.as_ref().map(|n| n.items.len()));
    tracing::Span::current().record("feasible", feasible.unwrap_or(0));
    if !result.error.is_empty() {
        tracing::info!(error = %result.error, "filter refused the pod");
    }
    Json(result)
}

#[tracing::instrument(name = "prioritize", skip_all, fields(pod = %pod_name(&args)))]
async fn prioritize_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderArgs>,
) -> Json<Vec<HostPriority>> {
    Json(prioritize(&extender.projection, &extender.config, &args))
}

#[tracing::instrument(name = "bind", skip_all, fields(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node))]
async fn bind_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderBindingArgs>,
) -> Json<ExtenderBindingResult> {
    match extender.binder.bind(&args, None).await {
        Ok(bound) => {
            tracing::info!(devices = ?bound.devices, "bound");
            Json(ExtenderBindingResult::default())
        }
        Err(error) => {
            tracing::warn!(%error, "bind failed; the pod will be retried");
            Json(ExtenderBindingResult {
                error: error.to_string(),
            })
        }
    }
}

async fn readyz(State(extender): State<Extender>) -> (StatusCode, &'static str) {
    if extender.projection.is_synced() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "GPU inventory still loading",
        )
    }
}

fn pod_name(args: &ExtenderArgs) -> String {
    let meta = &args.pod.metadata;
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}
