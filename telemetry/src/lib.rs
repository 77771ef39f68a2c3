//! Logs and OpenTelemetry traces for Tessera's binaries.
//!
//! Traces are exported over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the exporter reads the other
//! standard `OTEL_EXPORTER_OTLP_*` variables itself.
//!
//! One trace per pod: the admission webhook's span is its root and the
//! webhook writes that span's W3C context on the pod
//! ([`TRACEPARENT_ANNOTATION`]); the extender's Filter, Prioritize and Bind
//! spans are its children ([`pod_parent`], [`join`]); Bind stores its own
//! context on the VgpuAllocation ([`trace_context`]) and the node agent's
//! Allocate span continues from there.
//!
//! Logs and traces are filtered apart: `--log` decides what is printed,
//! while the exporter gets Tessera's own spans and events at INFO and the
//! decision details ([`DECISIONS`], e.g. each node Filter rejected) at
//! DEBUG, whatever is printed.

#![forbid(unsafe_code)]

use opentelemetry::{
    propagation::TextMapPropagator,
    trace::{TraceContextExt, TracerProvider},
};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tessera_api::v1alpha1::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    EnvFilter, Layer, Registry,
    filter::{LevelFilter, Targets},
    layer::SubscriberExt,
    util::SubscriberInitExt,
};

/// The pod annotation carrying the W3C `traceparent` of the pod's admission
/// span, which every later scheduling span of the pod continues.
pub const TRACEPARENT_ANNOTATION: &str = "tessera.dev/traceparent";

/// The target of decision details that go to traces, not to logs: events
/// at DEBUG under this target become span events (e.g. "rejected", with
/// the node and the reason) without printing a line per node.
pub const DECISIONS: &str = "tessera::decision";

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The log filter does not parse.
    #[error("--log {filter:?}: {message}")]
    LogFilter {
        /// The filter given.
        filter: String,
        /// What is wrong with it.
        message: String,
    },
    /// The OTLP exporter could not be built.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// A tracer provider for `service` exporting over OTLP/gRPC to `endpoint`,
/// or to the endpoint the standard environment variables name when `None`.
pub fn otlp_provider(
    service: &'static str,
    endpoint: Option<&str>,
) -> Result<SdkTracerProvider, Error> {
    let mut builder = SpanExporter::builder().with_tonic();
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let exporter = builder
        .build()
        .map_err(|e| Error::Exporter(e.to_string()))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}

/// The tracing layer that turns spans into OpenTelemetry spans of
/// `service`, filtered by [`exported`].
pub fn layer<S>(
    provider: &SdkTracerProvider,
    service: &'static str,
) -> impl tracing_subscriber::Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(service))
        .with_filter(exported())
}

/// Installs logging (and OTLP export when configured) for `service`;
/// returns the provider to flush at shutdown.
pub fn init(service: &'static str, log_filter: &str) -> Result<Option<SdkTracerProvider>, Error> {
    let filter = EnvFilter::try_new(log_filter).map_err(|e| Error::LogFilter {
        filter: log_filter.to_owned(),
        message: e.to_string(),
    })?;
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    let provider = configured
        .then(|| otlp_provider(service, None))
        .transpose()?;
    let registry = Registry::default().with(tracing_subscriber::fmt::layer().with_filter(filter));
    match &provider {
        Some(provider) => registry.with(layer(provider, service)).init(),
        None => registry.init(),
    }
    Ok(provider)
}

/// What goes to the exporter: Tessera's spans and events at INFO, its
/// decision details at DEBUG, nothing of its libraries (kube, hyper, tonic),
/// whatever `--log` prints.
pub fn exported() -> Targets {
    Targets::new()
        .with_default(LevelFilter::OFF)
        .with_target("tessera", LevelFilter::INFO)
        .with_target(DECISIONS, LevelFilter::DEBUG)
}

/// The trace context a pod's annotations carry ([`TRACEPARENT_ANNOTATION`]),
/// when it is one W3C `traceparent` (a tenant can write any annotation:
/// anything else is ignored, and a valid one only makes the pod's spans
/// children of a span it names).
pub fn pod_parent(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<TraceContext> {
    let traceparent = annotations?.get(TRACEPARENT_ANNOTATION)?;
    let context = TraceContext {
        traceparent: traceparent.clone(),
        tracestate: String::new(),
    };
    parent_context(&context)
        .span()
        .span_context()
        .is_valid()
        .then_some(context)
}

/// Makes `span` a child of the span a pod's annotations name
/// ([`pod_parent`]); a pod naming none leaves it as it is.
pub fn join_pod(
    span: &tracing::Span,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) {
    if let Some(parent) = pod_parent(annotations) {
        join(span, &parent);
    }
}

fn parent_context(stored: &TraceContext) -> opentelemetry::Context {
    let mut carrier = std::collections::HashMap::new();
    carrier.insert("traceparent".to_owned(), stored.traceparent.clone());
    if !stored.tracestate.is_empty() {
        carrier.insert("tracestate".to_owned(), stored.tracestate.clone());
    }
    TraceContextPropagator::new().extract(&carrier)
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

/// Makes `span` a child of the span a stored trace context names, so work
/// done elsewhere (the node agent's Allocate) joins the scheduler's trace.
/// An unparsable context leaves the span a root. Call it before the span is
/// first entered: a started span keeps the parent it started with.
pub fn join(span: &tracing::Span, stored: &TraceContext) {
    let parent = parent_context(stored);
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_sdk::trace::InMemorySpanExporter;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// A subscriber exporting through [`layer`] into memory, the memory,
    /// and the provider (dropping it shuts the exporter down).
    fn recording() -> (
        InMemorySpanExporter,
        SdkTracerProvider,
        impl tracing::Subscriber,
    ) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = Registry::default().with(layer(&provider, "test"));
        (exporter, provider, subscriber)
    }

    #[test]
    fn a_joined_span_continues_the_stored_trace_and_hands_its_context_on() {
        let (exporter, _provider, subscriber) = recording();
        let stored = TraceContext {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: "vendor=value".into(),
        };
        let handed_on = tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("allocate");
            join(&span, &stored);
            let _entered = span.enter();
            trace_context()
        });
        let handed_on = handed_on.expect("the joined span is traced");
        assert!(
            handed_on
                .traceparent
                .starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{handed_on:?}"
        );
        assert_eq!(handed_on.tracestate, "vendor=value");
        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        assert_eq!(
            spans[0].span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(spans[0].parent_span_id.to_string(), "00f067aa0ba902b7");

        // A malformed context leaves the span a root of its own trace.
        let (exporter, _provider, subscriber) = recording();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("allocate");
            join(
                &span,
                &TraceContext {
                    traceparent: "garbage".into(),
                    tracestate: String::new(),
                },
            );
            drop(span.enter());
        });
        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        assert_eq!(
            spans[0].parent_span_id,
            opentelemetry::trace::SpanId::INVALID
        );
    }

    #[test]
    fn a_pod_names_its_parent_only_with_one_valid_traceparent() {
        let annotations = |value: &str| {
            std::collections::BTreeMap::from([(
                TRACEPARENT_ANNOTATION.to_owned(),
                value.to_owned(),
            )])
        };
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            pod_parent(Some(&annotations(valid))).map(|c| c.traceparent),
            Some(valid.to_owned())
        );
        for hostile in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, 00-1-2-01",
            &"0".repeat(100_000),
        ] {
            assert!(
                pod_parent(Some(&annotations(hostile))).is_none(),
                "{:?}",
                &hostile[..hostile.len().min(80)]
            );
        }
        assert!(pod_parent(None).is_none());
        assert!(pod_parent(Some(&Default::default())).is_none());
    }

    #[test]
    fn the_exporter_gets_tesseras_spans_and_decisions_but_not_its_libraries() {
        let (exporter, _provider, subscriber) = recording();
        tracing::subscriber::with_default(subscriber, || {
            let filter = tracing::info_span!(target: "tessera_controllers::extender", "filter");
            filter.in_scope(|| {
                // The literal the extender uses must be this crate's target.
                tracing::event!(target: "tessera::decision", tracing::Level::DEBUG, node = "n1", "rejected");
                tracing::debug!(target: "tessera_controllers::extender", "a debug line");
            });
            drop(tracing::info_span!(target: "hyper::client", "connect").entered());
            drop(tracing::debug_span!(target: "tessera_node_agent", "chatty").entered());
        });
        assert_eq!(DECISIONS, "tessera::decision");
        let spans = exporter.get_finished_spans().unwrap();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["filter"], "libraries and DEBUG spans stay out");
        let events: Vec<&str> = spans[0].events.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(events, ["rejected"], "decisions in, other DEBUG events out");
    }
}
