//! The kube-scheduler extender over HTTP: `POST /filter`, `/prioritize`,
//! `/bind`, `/preempt`.
//!
//! Every verb answers 200 with the extender's JSON; errors travel in the
//! `Error` field, as kube-scheduler expects. The extender's metrics are its
//! own ([`ExtenderMetrics`]); the app serves `/metrics`, `/healthz` and
//! `/readyz` beside the verbs (and on `--metrics-addr`).

mod bind;
mod filter;
mod handoff;
mod lock;
mod metrics;
mod nudge;
mod placed;
mod preempt;
#[cfg(test)]
mod preempt_tests;
pub(crate) mod probe;
mod seen;
pub mod victims;
pub mod wire;

use std::{sync::Arc, time::Instant};

use axum::{Json, Router, extract::State, routing::post};
use kube::Client;

pub use bind::{Binder, Bound};
pub use filter::{NO_GPU_NODE, OVER_QUOTA, filter, prioritize};
pub use lock::{holder_needs_lock, lock_object};
pub use metrics::{ExtenderMetrics, ReasonLabels, VerbLabels};
pub use nudge::{GPU_FREED, nudge_nodes};
use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    ExtenderPreemptionArgs, ExtenderPreemptionResult, HostPriority,
};

use crate::{config::Config, projection::Projection};

/// How long Filter waits for the first lists of a starting replica.
const LOADING_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// What the handlers share.
#[derive(Clone)]
pub struct Extender {
    projection: Projection,
    config: Arc<Config>,
    binder: Binder,
    preemptor: preempt::Preemptor,
    metrics: ExtenderMetrics,
}

impl Extender {
    /// An extender reading `projection` and writing through `client`.
    pub fn new(
        client: Client,
        projection: Projection,
        config: Arc<Config>,
        metrics: ExtenderMetrics,
    ) -> Self {
        let binder = Binder::new(
            client.clone(),
            projection.clone(),
            config.clone(),
            metrics.clone(),
        );
        let preemptor =
            preempt::Preemptor::new(client, projection.clone(), config.clone(), metrics.clone());
        Self {
            projection,
            config,
            binder,
            preemptor,
            metrics,
        }
    }

    /// The four verbs.
    pub fn router(self) -> Router {
        Router::new()
            .route("/filter", post(filter_handler))
            .route("/prioritize", post(prioritize_handler))
            .route("/bind", post(bind_handler))
            .route("/preempt", post(preempt_handler))
            .with_state(self)
    }

    fn observe(&self, verb: &'static str, ok: bool, started: Instant) {
        self.metrics
            .observe(verb, ok, started.elapsed().as_secs_f64());
    }
}

#[tracing::instrument(name = "filter", skip_all, fields(pod = %pod_name(&args), candidates = args.candidate_names().len(), feasible, rejected, top_reason))]
async fn filter_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderArgs>,
) -> Json<ExtenderFilterResult> {
    let started = Instant::now();
    if !extender.projection.is_synced() {
        // Just started: wait a little for the first lists rather than
        // answer an error, which sends the pod into kube-scheduler's backoff
        // (up to 10 s) although the inventory is a moment away. Bounded:
        // kube-scheduler's scheduling loop waits meanwhile.
        let _ = tokio::time::timeout(LOADING_WAIT, extender.projection.wait_synced()).await;
    }
    let result = filter(&extender.projection, &extender.config, &args);
    if result.error.is_empty() {
        extender.binder.seen().remember(&args.pod);
    }
    if extender.config.device_preemption {
        extender.preemptor.after_filter(&args.pod, &result);
    }
    let feasible = result
        .node_names
        .as_ref()
        .map(Vec::len)
        .or(result.nodes.as_ref().map(|n| n.items.len()));
    let span = tracing::Span::current();
    span.record("feasible", feasible.unwrap_or(0));
    span.record(
        "rejected",
        result.failed_nodes.len() + result.failed_and_unresolvable_nodes.len(),
    );
    if let Some(reason) = result
        .failed_nodes
        .values()
        .chain(result.failed_and_unresolvable_nodes.values())
        .next()
    {
        span.record("top_reason", reason.as_str());
    }
    if !result.error.is_empty() {
        tracing::info!(error = %result.error, "filter refused the pod");
    }
    extender.observe("filter", result.error.is_empty(), started);
    Json(result)
}

#[tracing::instrument(name = "prioritize", skip_all, fields(pod = %pod_name(&args)))]
async fn prioritize_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderArgs>,
) -> Json<Vec<HostPriority>> {
    let started = Instant::now();
    let binder = &extender.binder;
    let scores = prioritize(&extender.projection, &extender.config, &args, |node| {
        binder.bind_pending(node)
    });
    extender.observe("prioritize", true, started);
    Json(scores)
}

async fn preempt_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderPreemptionArgs>,
) -> Json<ExtenderPreemptionResult> {
    let started = Instant::now();
    let result = extender.preemptor.answer(&args).await;
    extender.observe("preempt", result.is_ok(), started);
    // An error leaves the pod without candidates; kube-scheduler retries it.
    Json(result.unwrap_or_else(|error| {
        tracing::warn!(%error, "preempt verb failed");
        ExtenderPreemptionResult::default()
    }))
}

#[tracing::instrument(name = "bind", skip_all, fields(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node, devices, error))]
async fn bind_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderBindingArgs>,
) -> Json<ExtenderBindingResult> {
    let started = Instant::now();
    let result = extender
        .binder
        .bind(&args, crate::telemetry::trace_context())
        .await;
    extender.observe("bind", result.is_ok(), started);
    match result {
        Ok(bound) => {
            tracing::Span::current().record("devices", format!("{:?}", bound.devices));
            tracing::info!(devices = ?bound.devices, "bound");
            Json(ExtenderBindingResult::default())
        }
        Err(error) => {
            tracing::Span::current().record("error", error.to_string());
            tracing::warn!(%error, "bind failed; the pod will be retried");
            Json(ExtenderBindingResult {
                error: error.to_string(),
            })
        }
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
