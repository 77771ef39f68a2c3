//! The mutating admission webhook (AdmissionReview v1) for pods.
//!
//! It always answers with an AdmissionReview, never a bare HTTP error: an
//! unreadable review is answered "invalid", a bad GPU request is denied with
//! the parser's message naming container, field and rule.

mod mutate;

use std::sync::Arc;

use axum::{Json, Router, extract::State, routing::post};
use k8s_openapi::api::core::v1::Pod;
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
};

pub use mutate::{DEFAULT_SCHEDULER, Verdict, mutate};

use crate::{config::Config, projection::Projection};

/// What the webhook handler needs.
#[derive(Clone)]
pub struct Webhook {
    config: Arc<Config>,
    projection: Projection,
}

impl Webhook {
    /// A webhook using the projection to know the largest GPU in the cluster.
    pub fn new(config: Arc<Config>, projection: Projection) -> Self {
        Self { config, projection }
    }

    /// `POST /mutate`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/mutate", post(handle))
            .with_state(self)
    }

    /// Answers one review.
    pub fn review(&self, review: AdmissionReview<Pod>) -> AdmissionReview<DynamicObject> {
        let request: AdmissionRequest<Pod> = match review.try_into() {
            Ok(request) => request,
            Err(error) => return AdmissionResponse::invalid(error.to_string()).into_review(),
        };
        let response = AdmissionResponse::from(&request);
        let Some(pod) = &request.object else {
            return response.into_review();
        };
        let largest = self.projection.read().largest_device_mib();
        let name = pod
            .metadata
            .name
            .as_deref()
            .or(pod.metadata.generate_name.as_deref())
            .unwrap_or_default();
        match mutate(pod, &self.config, largest) {
            Verdict::Untouched => response.into_review(),
            Verdict::Denied(message) => {
                tracing::info!(namespace = ?request.namespace, pod = name, reason = %message, "denied GPU pod");
                response.deny(message).into_review()
            }
            Verdict::Mutated(mutated) => {
                let before = serde_json::to_value(pod).unwrap_or_default();
                let after = serde_json::to_value(&*mutated).unwrap_or_default();
                match response.with_patch(json_patch::diff(&before, &after)) {
                    Ok(response) => response.into_review(),
                    Err(error) => AdmissionResponse::invalid(error.to_string()).into_review(),
                }
            }
        }
    }
}

async fn handle(
    State(webhook): State<Webhook>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(webhook.review(review))
}
