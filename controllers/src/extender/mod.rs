//! The kube-scheduler extender over HTTP: `POST /filter`, `/prioritize`,
//! `/bind`, `/preempt`.
//!
//! Every verb answers 200 with the extender's JSON; errors travel in the
//! `Error` field, as kube-scheduler expects. The extender's metrics are its
//! own ([`ExtenderMetrics`]); the app serves `/metrics`, `/healthz` and
//! `/readyz` beside the verbs (and on `--metrics-addr`).

mod bind;
mod budgets;
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
use tracing::Instrument;

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

/// How many rejected nodes a Filter span lists as events (the rest are
/// counted): the OpenTelemetry SDK keeps at most 128 events per span.
const REJECTIONS_TRACED: usize = 100;

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

/// The INFO span `$name` of one verb about the pod of `$args` (an
/// [`ExtenderArgs`]): the pod's identity, the candidates' count and
/// `$fields`, in the pod's trace ([`in_pod_trace`]).
macro_rules! pod_span {
    ($name:literal, $args:expr, $($fields:tt)*) => {
        in_pod_trace(
            tracing::info_span!(
                $name,
                k8s.namespace.name = $args.pod.metadata.namespace.as_deref().unwrap_or_default(),
                k8s.pod.name = $args.pod.metadata.name.as_deref().unwrap_or_default(),
                k8s.pod.uid = $args.pod.metadata.uid.as_deref().unwrap_or_default(),
                candidates = $args.candidate_names().len(),
                $($fields)*
            ),
            &$args.pod,
        )
    };
}

async fn filter_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderArgs>,
) -> Json<ExtenderFilterResult> {
    let span = pod_span!(
        "filter",
        args,
        feasible = tracing::field::Empty,
        rejected = tracing::field::Empty,
        top_reason = tracing::field::Empty,
    );
    filter_answer(extender, args).instrument(span).await
}

async fn filter_answer(extender: Extender, args: ExtenderArgs) -> Json<ExtenderFilterResult> {
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
    let mut rejections = result
        .failed_nodes
        .iter()
        .chain(&result.failed_and_unresolvable_nodes);
    if let Some((_, reason)) = rejections.clone().next() {
        span.record("top_reason", reason.as_str());
    }
    // Each rejected node's reason, for the trace only (the target is
    // `crate::telemetry::DECISIONS`; a macro needs it literal); bounded below the
    // SDK's 128 events per span.
    if tracing::enabled!(target: "tessera::decision", tracing::Level::DEBUG) {
        for (node, reason) in rejections.by_ref().take(REJECTIONS_TRACED) {
            tracing::event!(target: "tessera::decision", tracing::Level::DEBUG, k8s.node.name = %node, %reason, "rejected");
        }
        let unlisted = rejections.count();
        if unlisted > 0 {
            tracing::debug!(target: "tessera::decision", unlisted, "more nodes rejected");
        }
    }
    if !result.error.is_empty() {
        tracing::info!(error = %result.error, "filter refused the pod");
    }
    extender.observe("filter", result.error.is_empty(), started);
    Json(result)
}

async fn prioritize_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderArgs>,
) -> Json<Vec<HostPriority>> {
    let span = pod_span!(
        "prioritize",
        args,
        best = tracing::field::Empty,
        best_score = tracing::field::Empty,
    );
    let _entered = span.enter();
    let started = Instant::now();
    let binder = &extender.binder;
    let scores = prioritize(&extender.projection, &extender.config, &args, |node| {
        binder.bind_pending(node)
    });
    if let Some(best) = scores.iter().max_by_key(|h| h.score) {
        span.record("best", best.host.as_str());
        span.record("best_score", best.score);
    }
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

async fn bind_handler(
    State(extender): State<Extender>,
    Json(args): Json<ExtenderBindingArgs>,
) -> Json<ExtenderBindingResult> {
    let span = tracing::info_span!(
        "bind",
        k8s.namespace.name = %args.pod_namespace,
        k8s.pod.name = %args.pod_name,
        k8s.pod.uid = %args.pod_uid,
        k8s.node.name = %args.node,
        devices = tracing::field::Empty,
        error = tracing::field::Empty,
    );
    // The pod Filter saw carries its trace; one it did not (another replica
    // filtered it) is bound in a trace of its own.
    if let Some(parent) = extender.binder.seen().trace_parent(&args.pod_uid) {
        crate::telemetry::join(&span, &parent);
    }
    // On a task of its own: kube-scheduler closing the connection (its
    // httpTimeout) drops this handler, and a Bind dropped midway would leave
    // its reservation in the ledger and the node's lock until its TTL
    // (review 2026-12-01, L2). The task finishes, or undoes, what it began.
    let answer = tokio::spawn(bind_answer(extender, args).instrument(span));
    answer.await.unwrap_or_else(|error| {
        tracing::error!(%error, "the Bind task failed");
        Json(ExtenderBindingResult {
            error: format!("the Bind task failed: {error}"),
        })
    })
}

async fn bind_answer(extender: Extender, args: ExtenderBindingArgs) -> Json<ExtenderBindingResult> {
    let started = Instant::now();
    let result = extender
        .binder
        .bind(&args, crate::telemetry::trace_context())
        .await;
    extender.observe("bind", result.is_ok(), started);
    match result {
        Ok(bound) => {
            tracing::Span::current().record("devices", devices_attribute(&bound.devices));
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

/// Bind's `devices` attribute: `container=UUID,UUID;container=UUID`.
fn devices_attribute(devices: &[(String, Vec<String>)]) -> String {
    devices
        .iter()
        .map(|(container, uuids)| format!("{container}={}", uuids.join(",")))
        .collect::<Vec<_>>()
        .join(";")
}

/// `span`, made a child of the pod's admission span when the pod carries
/// its context ([`crate::telemetry::TRACEPARENT_ANNOTATION`]).
fn in_pod_trace(span: tracing::Span, pod: &k8s_openapi::api::core::v1::Pod) -> tracing::Span {
    crate::telemetry::join_pod(&span, pod.metadata.annotations.as_ref());
    span
}
