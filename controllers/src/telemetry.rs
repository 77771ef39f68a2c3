//! Logs and OpenTelemetry traces.
//!
//! Traces are exported over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the exporter reads the other
//! standard `OTEL_EXPORTER_OTLP_*` variables itself. Every filter, prioritize
//! and bind is a span; Bind stores its W3C trace context on the allocation so
//! the node agent's work can join the same trace.

use opentelemetry::trace::{TraceContextExt, TracerProvider};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tessera_api::v1alpha1::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{EnvFilter, Registry, layer::SubscriberExt, util::SubscriberInitExt};

use crate::Error;

/// The service name spans carry.
pub const SERVICE_NAME: &str = "tessera-controller";

/// A tracer provider exporting over OTLP/gRPC to `endpoint`, or to the
/// endpoint the standard environment variables name when `None`.
pub fn otlp_provider(endpoint: Option<&str>) -> Result<SdkTracerProvider, Error> {
    let mut builder = SpanExporter::builder().with_tonic();
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let exporter = builder
        .build()
        .map_err(|e| Error::Config(format!("OTLP exporter: {e}")))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(SERVICE_NAME).build())
        .build())
}

/// The tracing layer that turns spans into OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(SERVICE_NAME))
}

/// Installs logging (and OTLP export when configured); returns the provider
/// to flush at shutdown.
pub fn init(log_filter: &str) -> Result<Option<SdkTracerProvider>, Error> {
    let filter = EnvFilter::try_new(log_filter)
        .map_err(|e| Error::Config(format!("--log {log_filter:?}: {e}")))?;
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    let provider = configured.then(|| otlp_provider(None)).transpose()?;
    let registry = Registry::default()
        .with(filter)
        .with(tracing_subscriber::fmt::layer());
    match &provider {
        Some(provider) => registry.with(layer(provider)).init(),
        None => registry.init(),
    }
    Ok(provider)
}

/// The current span's W3C trace context, when it is being traced.
pub fn trace_context() -> Option<TraceContext> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| TraceContext {
        traceparent: format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        ),
        tracestate: span_context.trace_state().header(),
    })
}
