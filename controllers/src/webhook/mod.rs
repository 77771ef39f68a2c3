//! The mutating admission webhook (AdmissionReview v1) for pods.
//!
//! It always answers with an AdmissionReview, never a bare HTTP error: an
//! unreadable review is answered "invalid", a bad GPU request is denied with
//! the parser's message naming container, field and rule. Every answer is
//! counted by [`Outcome`] in `tessera_webhook_requests_total`.
//!
//! [`certificate`] serves the certificate files and reloads them when they
//! are rotated.

pub mod certificate;
mod metrics;
mod mounts;
mod mutate;
pub mod owned;

use std::sync::Arc;

use axum::{Json, Router, body::Bytes, extract::State, routing::post};
use k8s_openapi::api::core::v1::Pod;
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
};

pub use mutate::{DEFAULT_SCHEDULER, NamespaceQuota, Verdict, mutate};

pub use metrics::{Outcome, OutcomeLabels, WebhookMetrics};

use crate::{Error, config::Config, projection::Projection};
use certificate::CertificateFiles;

/// What the webhook handler needs.
#[derive(Clone)]
pub struct Webhook {
    config: Arc<Config>,
    projection: Projection,
    metrics: WebhookMetrics,
}

impl Webhook {
    /// A webhook using the projection to know the largest GPU in the
    /// cluster, counting its answers in `metrics`.
    pub fn new(config: Arc<Config>, projection: Projection, metrics: WebhookMetrics) -> Self {
        Self {
            config,
            projection,
            metrics,
        }
    }

    /// `POST /mutate`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/mutate", post(handle))
            .with_state(self)
    }

    /// Answers one review, counting the answer, in the pod's first span
    /// (`admit`): the root of the pod's trace, whose context a mutated pod
    /// carries on ([`crate::telemetry::TRACEPARENT_ANNOTATION`]). A pod that
    /// already names a valid parent (its creator's trace) continues it.
    pub fn review(&self, review: AdmissionReview<Pod>) -> AdmissionReview<DynamicObject> {
        let span = admit_span(&review);
        let (outcome, answer) = span.in_scope(|| self.answer(review));
        span.record("outcome", outcome.label());
        self.metrics.count(outcome);
        answer
    }

    /// Answers a request body that is not a readable AdmissionReview.
    fn unreadable(&self, error: &str) -> AdmissionReview<DynamicObject> {
        tracing::warn!(%error, "unreadable admission review");
        self.metrics.count(Outcome::Error);
        AdmissionResponse::invalid(format!("unreadable AdmissionReview: {error}")).into_review()
    }

    fn answer(&self, review: AdmissionReview<Pod>) -> (Outcome, AdmissionReview<DynamicObject>) {
        let request: AdmissionRequest<Pod> = match review.try_into() {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%error, "admission review without a request");
                return (
                    Outcome::Error,
                    AdmissionResponse::invalid(error.to_string()).into_review(),
                );
            }
        };
        let response = AdmissionResponse::from(&request);
        let Some(pod) = &request.object else {
            return (Outcome::Allowed, response.into_review());
        };
        let largest = self.projection.read().largest_device_mib();
        let namespace = request.namespace.as_deref().unwrap_or("default");
        let limits = self
            .projection
            .quota_limits(namespace, &self.config.request);
        let quota = NamespaceQuota {
            used: if limits.is_empty() {
                Default::default()
            } else {
                self.projection.read().namespace_used(namespace).clone()
            },
            limits,
        };
        let name = pod
            .metadata
            .name
            .as_deref()
            .or(pod.metadata.generate_name.as_deref())
            .unwrap_or_default();
        match mutate(pod, &self.config, largest, &quota) {
            Verdict::Untouched => (Outcome::Allowed, response.into_review()),
            Verdict::Denied(message) => {
                tracing::info!(namespace = ?request.namespace, pod = name, reason = %message, "denied GPU pod");
                (Outcome::Denied, response.deny(message).into_review())
            }
            Verdict::Mutated(mut mutated) => {
                // Only when the span is exported (a context is valid).
                if let Some(context) = crate::telemetry::trace_context() {
                    mutated.metadata.annotations.get_or_insert_default().insert(
                        crate::telemetry::TRACEPARENT_ANNOTATION.to_owned(),
                        context.traceparent,
                    );
                }
                let before = serde_json::to_value(pod).unwrap_or_default();
                let after = serde_json::to_value(&*mutated).unwrap_or_default();
                match response.with_patch(json_patch::diff(&before, &after)) {
                    Ok(response) => (Outcome::Mutated, response.into_review()),
                    Err(error) => {
                        tracing::warn!(namespace = ?request.namespace, pod = name, %error, "could not encode the pod's patch");
                        (
                            Outcome::Error,
                            AdmissionResponse::invalid(error.to_string()).into_review(),
                        )
                    }
                }
            }
        }
    }
}

/// The `admit` span of the pod a review is about, a child of the span the
/// pod's own annotation names, if any. The API server gives a pod its UID
/// after admission, so the span has the pod's namespace and name (or the
/// prefix a generated name will start with), not its UID.
fn admit_span(review: &AdmissionReview<Pod>) -> tracing::Span {
    let pod = review.request.as_ref().and_then(|r| r.object.as_ref());
    let meta = pod.map(|p| &p.metadata);
    let span = tracing::info_span!(
        "admit",
        k8s.namespace.name = review
            .request
            .as_ref()
            .and_then(|r| r.namespace.as_deref())
            .unwrap_or_default(),
        k8s.pod.name = meta.and_then(|m| m.name.as_deref()).unwrap_or_default(),
        k8s.pod.generate_name = meta
            .and_then(|m| m.generate_name.as_deref())
            .unwrap_or_default(),
        outcome = tracing::field::Empty,
    );
    crate::telemetry::join_pod(&span, meta.and_then(|m| m.annotations.as_ref()));
    span
}

/// Reads the body itself, so an unreadable review is answered (and counted)
/// like any other.
async fn handle(
    State(webhook): State<Webhook>,
    body: Bytes,
) -> Json<AdmissionReview<DynamicObject>> {
    match serde_json::from_slice::<AdmissionReview<Pod>>(&body) {
        Ok(review) => Json(webhook.review(review)),
        Err(error) => Json(webhook.unreadable(&unreadable_reason(&body, &error))),
    }
}

/// Why a body is not an AdmissionReview, naming the field at fault (e.g.
/// `request.object.spec.containers[0].name: invalid type: ...`) when the
/// body is JSON. `AdmissionReview` flattens its type fields, which hides the
/// path from serde, so the request is decoded again on its own to find it.
fn unreadable_reason(body: &[u8], error: &serde_json::Error) -> String {
    let request = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|mut review| review.get_mut("request").map(serde_json::Value::take));
    if let Some(request) = request
        && let Err(found) = serde_path_to_error::deserialize::<_, AdmissionRequest<Pod>>(request)
    {
        let path = found.path().to_string();
        return match path.as_str() {
            "." => format!("request: {}", found.inner()),
            _ => format!("request.{path}: {}", found.inner()),
        };
    }
    error.to_string()
}

/// Serves the webhook over HTTPS on `listener` until the task is dropped,
/// reloading the certificate when its files change.
pub async fn serve(
    listener: std::net::TcpListener,
    mut files: CertificateFiles,
    webhook: Webhook,
) -> Result<(), Error> {
    // kube and axum-server both use rustls with ring; make ring the process default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = files.load().await?;
    listener
        .set_nonblocking(true)
        .map_err(Error::serve("the webhook's listener"))?;
    let server = axum_server::from_tcp_rustls(listener, tls.clone())
        .map_err(Error::serve("the webhook's listener"))?
        .serve(webhook.router().into_make_service());
    tokio::select! {
        result = server => result.map_err(Error::serve("serving the webhook"))?,
        () = files.keep_current(tls) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests;
