//! Logs and OpenTelemetry traces of the controller (see `tessera_telemetry`):
//! the webhook's `admit` span starts each GPU pod's trace; every filter,
//! prioritize and bind of the pod is a span in it, and Bind stores its W3C
//! trace context on the allocation so the node agent's Allocate joins it.

use opentelemetry_sdk::trace::SdkTracerProvider;

pub use tessera_telemetry::{
    DECISIONS, TRACEPARENT_ANNOTATION, join, join_pod, pod_parent, trace_context,
};

use crate::Error;

/// The service name spans carry.
pub const SERVICE_NAME: &str = "tessera-controller";

/// A tracer provider exporting over OTLP/gRPC to `endpoint`, or to the
/// endpoint the standard environment variables name when `None`.
pub fn otlp_provider(endpoint: Option<&str>) -> Result<SdkTracerProvider, Error> {
    tessera_telemetry::otlp_provider(SERVICE_NAME, endpoint)
        .map_err(|e| Error::Config(e.to_string()))
}

/// The tracing layer that turns spans into OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tessera_telemetry::layer(provider, SERVICE_NAME)
}

/// Installs logging (and OTLP export when configured); returns the provider
/// to flush at shutdown.
pub fn init(log_filter: &str) -> Result<Option<SdkTracerProvider>, Error> {
    tessera_telemetry::init(SERVICE_NAME, log_filter).map_err(|e| Error::Config(e.to_string()))
}
