//! Every answer of the webhook is counted by its outcome.

use axum::{body::Body, http::Request};
use serde_json::{Value, json};
use tower::ServiceExt;

use prometheus_client::{encoding::text::encode, registry::Registry};

use super::*;

/// A webhook whose metrics are registered in the returned registry.
fn webhook() -> (Webhook, Registry) {
    let (projection, _feeder) = Projection::new();
    let mut registry = Registry::with_prefix("tessera");
    let metrics = WebhookMetrics::register(&mut registry);
    (
        Webhook::new(Arc::new(Config::default()), projection, metrics),
        registry,
    )
}

/// An AdmissionReview of a pod create, as the API server sends it.
fn review_of(limits: Value) -> AdmissionReview<Pod> {
    serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE", "namespace": "default", "name": "p",
            "userInfo": {"username": "admin"},
            "object": {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
            },
            "dryRun": false,
        },
    }))
    .unwrap()
}

fn count(registry: &Registry, outcome: &str) -> Option<String> {
    let needle = format!("tessera_webhook_requests_total{{outcome=\"{outcome}\"}} ");
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&needle).map(str::to_owned))
}

#[test]
fn answers_are_counted_as_allowed_mutated_denied_or_error() {
    let (webhook, metrics) = webhook();
    let allowed = webhook.review(review_of(json!({"cpu": "1"})));
    assert!(allowed.response.as_ref().unwrap().allowed);
    let mutated = webhook.review(review_of(json!({"nvidia.com/gpumem": "1000"})));
    assert!(mutated.response.as_ref().unwrap().patch.is_some());
    let denied = webhook.review(review_of(json!({"nvidia.com/gpucores": "101"})));
    assert!(!denied.response.as_ref().unwrap().allowed);
    let mut no_request = review_of(json!({}));
    no_request.request = None;
    webhook.review(no_request);

    for (outcome, expected) in [
        ("allowed", "1"),
        ("mutated", "1"),
        ("denied", "1"),
        ("error", "1"),
    ] {
        assert_eq!(
            count(&metrics, outcome).as_deref(),
            Some(expected),
            "{outcome}"
        );
    }
}

#[tokio::test]
async fn an_unreadable_body_is_answered_and_counted_as_an_error() {
    let (webhook, metrics) = webhook();
    let response = webhook
        .router()
        .oneshot(
            Request::post("/mutate")
                .header("content-type", "application/json")
                .body(Body::from("{not json"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), axum::http::StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let review: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(review["response"]["allowed"], json!(false), "{review}");
    assert!(
        review["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unreadable AdmissionReview")),
        "{review}"
    );
    assert_eq!(count(&metrics, "error").as_deref(), Some("1"));
}
