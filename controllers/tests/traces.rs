//! OpenTelemetry: Bind's span reaches an OTLP receiver with the pod, node
//! and devices, and the allocation carries that span's W3C trace context.
//!
//! Its own test binary: it installs the process-wide tracing subscriber.

use tessera_testkit::cluster as support;

use std::time::Duration;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_spans_reach_the_otlp_receiver_and_the_allocation_joins_the_trace() {
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
    cluster
        .add_gpu_node("traced", "NVIDIA A100-SXM4-80GB", 1, 81920)
        .await;
    cluster
        .create_pod(
            "traced-pod",
            json!({"nvidia.com/gpumem": "2048"}),
            json!({}),
        )
        .await;
    cluster.node_of("traced-pod").await;
    let allocation = cluster.allocation("traced-pod").await;
    // force_flush blocks until the exporter (which runs on this runtime) is
    // done: keep it off the runtime's worker threads.
    let flushing = provider.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush())
        .await
        .unwrap()
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let bind = loop {
        let span = tokio::time::timeout_at(deadline, spans.recv())
            .await
            .expect("a bind span within 30 s")
            .unwrap();
        if span.name == "bind" && attribute(&span, "pod").as_deref() == Some("traced-pod") {
            break span;
        }
    };
    assert_eq!(attribute(&bind, "node").as_deref(), Some("traced"));
    assert_eq!(attribute(&bind, "namespace").as_deref(), Some("default"));
    assert!(
        attribute(&bind, "devices").is_some_and(|d| d.contains("GPU-traced-0")),
        "{:?}",
        bind.attributes
    );

    let context = allocation
        .spec
        .trace_context
        .expect("the allocation carries a trace context");
    let parts: Vec<&str> = context.traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{}", context.traceparent);
    assert_eq!(
        parts[1],
        hex(&bind.trace_id),
        "the allocation's trace is the bind span's trace"
    );
    assert_eq!(parts[2], hex(&bind.span_id), "the parent is the bind span");
}
