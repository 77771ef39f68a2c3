//! OpenTelemetry: one trace per pod. The webhook's `admit` span is its root
//! and its context is written on the pod; Filter (with each rejected node as
//! an event), Prioritize and Bind are its children with the pod's identity;
//! the allocation carries Bind's context for the node agent's Allocate.
//!
//! Its own test binary: it installs the process-wide tracing subscriber.

use tessera_testkit::cluster as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value::Value,
    trace::v1::Span,
};
use serde_json::json;
use support::{Cluster, spawn_allocate_stand_in};
use tessera_controllers::{config::Config, telemetry};
use tokio::sync::mpsc;
use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt};

/// An OTLP/gRPC trace receiver that hands every span to the test.
struct Receiver(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        for span in spans {
            let _ = self.0.send(span);
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The spans received until every one of `names` has arrived for the pod
/// (bind last: it comes after the others).
async fn spans_of_pod(spans: &mut mpsc::UnboundedReceiver<Span>, pod: &str) -> Vec<Span> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut got: Vec<Span> = Vec::new();
    while !got.iter().any(|s| s.name == "bind") {
        let span = tokio::time::timeout_at(deadline, spans.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "all spans of {pod} within 30 s; got {:?}",
                    got.iter().map(|s| &s.name).collect::<Vec<_>>()
                )
            })
            .unwrap();
        if attribute(&span, "k8s.pod.name").as_deref() == Some(pod) {
            got.push(span);
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_per_pod_from_admission_through_filter_prioritize_and_bind_to_the_allocation() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (tx, mut spans) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let provider = telemetry::otlp_provider(Some(&endpoint)).unwrap();
    tracing_subscriber::registry()
        .with(telemetry::layer(&provider))
        .init();

    let cluster = Cluster::start(Config::default()).await;
    spawn_allocate_stand_in(cluster.client.clone());
    // Two nodes fit (so kube-scheduler asks Prioritize), one is too small.
    for name in ["traced-a", "traced-b"] {
        cluster
            .add_gpu_node(name, "NVIDIA A100-SXM4-80GB", 1, 81920)
            .await;
    }
    cluster
        .add_gpu_node("too-small", "NVIDIA T4", 1, 15360)
        .await;
    cluster
        .create_pod(
            "traced-pod",
            json!({"nvidia.com/gpumem": "20480"}),
            json!({}),
        )
        .await;
    let node = cluster.node_of("traced-pod").await;
    let allocation = cluster.allocation("traced-pod").await;
    let pod: Pod = Api::namespaced(cluster.client.clone(), "default")
        .get("traced-pod")
        .await
        .unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    // force_flush blocks until the exporter (which runs on this runtime) is
    // done: keep it off the runtime's worker threads.
    let flushing = provider.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush())
        .await
        .unwrap()
        .unwrap();
    let got = spans_of_pod(&mut spans, "traced-pod").await;
    let one = |name: &str| {
        got.iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("a {name} span of the pod"))
    };

    // The webhook's span is the root; the pod carries its context.
    let admit = one("admit");
    assert!(admit.parent_span_id.is_empty(), "admit is the root");
    assert_eq!(
        attribute(admit, "k8s.namespace.name").as_deref(),
        Some("default")
    );
    assert_eq!(attribute(admit, "outcome").as_deref(), Some("mutated"));
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(telemetry::TRACEPARENT_ANNOTATION))
        .expect("the pod carries its trace context");
    assert_eq!(
        annotation,
        &format!("00-{}-{}-01", hex(&admit.trace_id), hex(&admit.span_id))
    );

    // Every scheduling step is a child of it, with the pod's identity.
    for name in ["filter", "prioritize", "bind"] {
        let span = one(name);
        assert_eq!(
            span.trace_id, admit.trace_id,
            "{name} is in the pod's trace"
        );
        assert_eq!(
            span.parent_span_id, admit.span_id,
            "{name} is admit's child"
        );
        assert_eq!(
            attribute(span, "k8s.pod.uid").as_deref(),
            Some(uid.as_str()),
            "{name}"
        );
        assert_eq!(
            attribute(span, "k8s.namespace.name").as_deref(),
            Some("default"),
            "{name}"
        );
        assert!(
            span.start_time_unix_nano >= admit.start_time_unix_nano,
            "{name} after admit"
        );
    }
    let filter = one("filter");
    assert!(one("prioritize").start_time_unix_nano >= filter.start_time_unix_nano);
    assert!(one("bind").start_time_unix_nano >= one("prioritize").start_time_unix_nano);
    assert_eq!(attribute(filter, "feasible").as_deref(), Some("2"));
    let rejected = filter
        .events
        .iter()
        .find(|e| e.name == "rejected")
        .expect("the rejected node as an event of filter");
    let event_attribute = |key: &str| {
        rejected
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
    };
    assert_eq!(
        event_attribute("k8s.node.name").as_deref(),
        Some("too-small")
    );
    assert!(
        event_attribute("reason").is_some_and(|r| !r.is_empty()),
        "{:?}",
        rejected.attributes
    );
    let best = attribute(one("prioritize"), "best").expect("prioritize names the best node");
    assert!(best.starts_with("traced-"), "{best}");

    // Bind names the chosen node and GPU; the allocation carries its context.
    let bind = one("bind");
    assert_eq!(
        attribute(bind, "k8s.node.name").as_deref(),
        Some(node.as_str())
    );
    assert!(
        attribute(bind, "devices").is_some_and(|d| d.contains(&format!("GPU-{node}-0"))),
        "{:?}",
        bind.attributes
    );
    let context = allocation
        .spec
        .trace_context
        .expect("the allocation carries a trace context");
    assert_eq!(
        context.traceparent,
        format!("00-{}-{}-01", hex(&bind.trace_id), hex(&bind.span_id)),
        "the node agent's Allocate continues from the bind span"
    );
}
