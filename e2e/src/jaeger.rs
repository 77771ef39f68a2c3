//! Jaeger for the demo and the trace test: Jaeger v2 built from its Go
//! module (`hack/tools.sh`), started beside the control plane with in-memory
//! storage, receiving OTLP/gRPC from Tessera's pods on the host's address,
//! and its query API read back ([`Jaeger::pod_trace`]) to show or check one
//! pod's trace ([`Trace::tree`]).
//!
//! Built from the module, Jaeger has no UI assets (they come from a separate
//! JavaScript build): its query API answers, its UI page is a placeholder.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use serde::Deserialize;

use crate::{ControlPlane, error::Error, http, net::free_ports};

/// The service name of the controller's spans (webhook and extender).
pub const CONTROLLER_SERVICE: &str = "tessera-controller";
/// The service name of the node agents' spans.
pub const AGENT_SERVICE: &str = "tessera-node-agent";

/// Where a Jaeger listens: OTLP/gRPC on the host's address (pods reach it
/// there), the query API and the health check on loopback.
#[derive(Clone, Debug)]
pub struct Ports {
    /// `<host ip>:<port>` of the OTLP/gRPC receiver.
    pub otlp: String,
    /// `127.0.0.1:<port>` of the query API.
    pub query: String,
    /// `127.0.0.1:<port>` of the health check.
    pub health: String,
}

impl Ports {
    /// Free ports on this machine, the receiver on `host_ip`. Chosen before
    /// the chart is installed, since its values name the receiver.
    pub fn choose(host_ip: &str) -> Result<Self, Error> {
        let [otlp, query, health] = free_ports::<3>()?;
        Ok(Self {
            otlp: format!("{host_ip}:{otlp}"),
            query: format!("127.0.0.1:{query}"),
            health: format!("127.0.0.1:{health}"),
        })
    }

    /// The chart's `otel.endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.otlp)
    }
}

/// Jaeger's configuration: OTLP/gRPC in, batched into the in-memory store,
/// the query API and health check out; no telemetry of its own.
pub fn config(ports: &Ports) -> String {
    format!(
        r#"service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: {health}
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: mem
    enable_tracing: false
    http:
      endpoint: {query}
    grpc:
      endpoint: 127.0.0.1:0
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {otlp}
processors:
  batch:
    timeout: 1s
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
"#,
        health = ports.health,
        query = ports.query,
        otlp = ports.otlp,
    )
}

/// A running Jaeger's query API.
#[derive(Clone, Debug)]
pub struct Jaeger {
    query: String,
}

impl Jaeger {
    /// Starts Jaeger on `ports` as one of `plane`'s processes (stopped with
    /// it, or by `tessera-demo down`) and waits until it is healthy.
    pub async fn start(plane: &ControlPlane, ports: &Ports) -> Result<Self, Error> {
        let dir = plane.dir().join("jaeger");
        std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, config(ports)).map_err(Error::io("write", &config_path))?;
        plane.spawn(
            "jaeger",
            &crate::tools::jaeger()?,
            &[format!("--config=file:{}", config_path.display())],
        )?;
        if !http::wait_ok(&ports.health, "/status", Duration::from_secs(60)).await {
            return Err(Error::Config(format!(
                "jaeger not healthy on {} within 60 s (see {}/jaeger.log)",
                ports.health,
                plane.dir().display()
            )));
        }
        Ok(Self {
            query: ports.query.clone(),
        })
    }

    /// A Jaeger already running with its query API at `addr`.
    pub fn at(addr: impl Into<String>) -> Self {
        Self { query: addr.into() }
    }

    /// The query API's address.
    pub fn addr(&self) -> &str {
        &self.query
    }

    /// The most recent trace holding a span of `service` tagged with the
    /// pod's UID (`k8s.pod.uid`), if Jaeger has one: [`CONTROLLER_SERVICE`]
    /// for a pod Tessera schedules, [`AGENT_SERVICE`] for one whose DRA claim
    /// an agent prepared.
    pub async fn pod_trace(&self, service: &str, uid: &str) -> Result<Option<Trace>, Error> {
        let tags = serde_json::json!({"k8s.pod.uid": uid}).to_string();
        let path = format!(
            "/api/traces?service={service}&tags={}&lookback=6h&limit=5",
            http::encode(&tags)
        );
        let body = http::get_body(&self.query, &path)
            .await
            .map_err(Error::Config)?;
        let answer: Answer = serde_json::from_str(&body)
            .map_err(|e| Error::Config(format!("jaeger {path}: {e}: {body}")))?;
        Ok(answer.data.into_iter().map(Trace::from).next())
    }

    /// The services that sent spans.
    pub async fn services(&self) -> Result<Vec<String>, Error> {
        let body = http::get_body(&self.query, "/api/services")
            .await
            .map_err(Error::Config)?;
        #[derive(Deserialize)]
        struct Services {
            #[serde(default)]
            data: Option<Vec<String>>,
        }
        let services: Services = serde_json::from_str(&body)
            .map_err(|e| Error::Config(format!("jaeger /api/services: {e}: {body}")))?;
        Ok(services.data.unwrap_or_default())
    }
}

/// The legacy query API's answer (`/api/traces`).
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    data: Vec<RawTrace>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawTrace {
    #[serde(rename = "traceID")]
    trace_id: String,
    spans: Vec<RawSpan>,
    #[serde(default)]
    processes: BTreeMap<String, RawProcess>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpan {
    #[serde(rename = "spanID")]
    span_id: String,
    operation_name: String,
    #[serde(default)]
    references: Vec<RawReference>,
    start_time: u64,
    duration: u64,
    #[serde(default)]
    tags: Vec<RawTag>,
    #[serde(default)]
    logs: Vec<RawLog>,
    #[serde(rename = "processID", default)]
    process_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawReference {
    ref_type: String,
    #[serde(rename = "spanID")]
    span_id: String,
}

#[derive(Deserialize)]
struct RawTag {
    key: String,
    value: serde_json::Value,
}

#[derive(Deserialize)]
struct RawLog {
    #[serde(default)]
    fields: Vec<RawTag>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawProcess {
    service_name: String,
}

/// One trace as Jaeger returns it.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Its ID (hex).
    pub id: String,
    /// Its spans, in the order they started.
    pub spans: Vec<Span>,
}

/// One span of a [`Trace`].
#[derive(Clone, Debug)]
pub struct Span {
    /// Its ID (hex).
    pub id: String,
    /// Its parent's ID, when it has one (a `CHILD_OF` reference).
    pub parent: Option<String>,
    /// Its name: `admit`, `filter`, `prioritize`, `bind`, `allocate`, ...
    pub name: String,
    /// The service that sent it.
    pub service: String,
    /// When it started, microseconds since the epoch.
    pub start_us: u64,
    /// How long it took, microseconds.
    pub duration_us: u64,
    /// Its attributes, values as text.
    pub tags: BTreeMap<String, String>,
    /// Its events, each its fields as text (`event` is the message).
    pub events: Vec<BTreeMap<String, String>>,
}

impl Span {
    /// An attribute, if set.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags.get(key).map(String::as_str)
    }
}

fn text(value: serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

fn fields(tags: Vec<RawTag>) -> BTreeMap<String, String> {
    tags.into_iter().map(|t| (t.key, text(t.value))).collect()
}

impl From<RawTrace> for Trace {
    fn from(raw: RawTrace) -> Self {
        let mut spans: Vec<Span> = raw
            .spans
            .into_iter()
            .map(|s| Span {
                parent: s
                    .references
                    .iter()
                    .find(|r| r.ref_type == "CHILD_OF")
                    .map(|r| r.span_id.clone()),
                service: raw
                    .processes
                    .get(&s.process_id)
                    .map(|p| p.service_name.clone())
                    .unwrap_or_default(),
                id: s.span_id,
                name: s.operation_name,
                start_us: s.start_time,
                duration_us: s.duration,
                tags: fields(s.tags),
                events: s.logs.into_iter().map(|l| fields(l.fields)).collect(),
            })
            .collect();
        spans.sort_by_key(|s| s.start_us);
        Self {
            id: raw.trace_id,
            spans,
        }
    }
}

impl Trace {
    /// The span with this ID.
    pub fn span(&self, id: &str) -> Option<&Span> {
        self.spans.iter().find(|s| s.id == id)
    }

    /// The spans named `name`, in the order they started.
    pub fn named(&self, name: &str) -> Vec<&Span> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }

    /// The trace as an indented tree: each span's service, name, offset
    /// from the trace's start, duration and its most telling attributes;
    /// children under their parents in the order they started.
    pub fn tree(&self) -> String {
        let start = self.spans.first().map_or(0, |s| s.start_us);
        let mut out = String::new();
        let roots = self
            .spans
            .iter()
            .filter(|s| s.parent.as_deref().is_none_or(|p| self.span(p).is_none()));
        for root in roots {
            self.write(&mut out, root, start, 0);
        }
        out
    }

    fn write(&self, out: &mut String, span: &Span, start: u64, depth: usize) {
        let shown: Vec<String> = SHOWN
            .iter()
            .filter_map(|key| {
                Some(format!(
                    "{key}={}",
                    span.tag(key).filter(|v| !v.is_empty())?
                ))
            })
            .collect();
        let _ = writeln!(
            out,
            "{:indent$}{} {}  +{:.1} ms  {:.1} ms  {}",
            "",
            span.service,
            span.name,
            span.start_us.saturating_sub(start) as f64 / 1000.0,
            span.duration_us as f64 / 1000.0,
            shown.join(" "),
            indent = depth * 2
        );
        for event in span.events.iter().take(EVENTS_SHOWN) {
            let fields: Vec<String> = event
                .iter()
                .filter(|(k, _)| {
                    !["event", "level", "target"].contains(&k.as_str()) && !k.starts_with("code.")
                })
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let message = event.get("event").map_or("", String::as_str);
            let fields = match fields.is_empty() {
                true => String::new(),
                false => format!(": {}", fields.join(" ")),
            };
            let _ = writeln!(
                out,
                "{:indent$}· {message}{fields}",
                "",
                indent = depth * 2 + 2
            );
        }
        if span.events.len() > EVENTS_SHOWN {
            let _ = writeln!(
                out,
                "{:indent$}· ({} more events)",
                "",
                span.events.len() - EVENTS_SHOWN,
                indent = depth * 2 + 2
            );
        }
        for child in self
            .spans
            .iter()
            .filter(|s| s.parent.as_deref() == Some(span.id.as_str()))
        {
            self.write(out, child, start, depth + 1);
        }
    }
}

/// How many of a span's events [`Trace::tree`] shows.
const EVENTS_SHOWN: usize = 4;

/// The attributes [`Trace::tree`] shows, where a span has them.
const SHOWN: [&str; 9] = [
    "k8s.namespace.name",
    "k8s.pod.name",
    "outcome",
    "feasible",
    "rejected",
    "best",
    "k8s.node.name",
    "devices",
    "error",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Jaeger's legacy answer, shaped as its query API returns it.
    const ANSWER: &str = r#"{"data": [{
        "traceID": "4bf92f3577b34da6a3ce929d0e0e4736",
        "spans": [
            {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "b2", "operationName": "bind",
             "references": [{"refType": "CHILD_OF", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a1"}],
             "startTime": 1000030000, "duration": 25000, "processID": "p1",
             "tags": [{"key": "k8s.node.name", "type": "string", "value": "gpu-a"},
                      {"key": "devices", "type": "string", "value": "cuda=GPU-0"}],
             "logs": [{"timestamp": 1000031000, "fields": [
                 {"key": "event", "type": "string", "value": "bound"},
                 {"key": "level", "type": "string", "value": "INFO"},
                 {"key": "code.line.number", "type": "int64", "value": 12}]}]},
            {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a1", "operationName": "admit",
             "references": [], "startTime": 1000000000, "duration": 1000, "processID": "p1",
             "tags": [{"key": "k8s.pod.name", "type": "string", "value": "share-a"},
                      {"key": "outcome", "type": "string", "value": "mutated"}]},
            {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "c3", "operationName": "allocate",
             "references": [{"refType": "CHILD_OF", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "b2"}],
             "startTime": 1000090000, "duration": 2000, "processID": "p2",
             "tags": [{"key": "feasible", "type": "int64", "value": 1}]}
        ],
        "processes": {"p1": {"serviceName": "tessera-controller", "tags": []},
                      "p2": {"serviceName": "tessera-node-agent", "tags": []}}
    }]}"#;

    fn trace() -> Trace {
        let answer: Answer = serde_json::from_str(ANSWER).unwrap();
        answer.data.into_iter().map(Trace::from).next().unwrap()
    }

    #[test]
    fn spans_are_ordered_linked_and_named_by_service() {
        let trace = trace();
        assert_eq!(trace.id, "4bf92f3577b34da6a3ce929d0e0e4736");
        let names: Vec<&str> = trace.spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["admit", "bind", "allocate"], "by start time");
        let allocate = trace.named("allocate")[0];
        assert_eq!(allocate.service, AGENT_SERVICE);
        assert_eq!(allocate.parent.as_deref(), Some("b2"));
        assert_eq!(allocate.tag("feasible"), Some("1"), "numbers as text");
        assert_eq!(trace.named("admit")[0].parent, None);
        assert_eq!(trace.named("bind")[0].events[0]["event"], "bound");
    }

    #[test]
    fn the_tree_nests_children_with_offsets_and_telling_attributes() {
        let tree = trace().tree();
        let lines: Vec<&str> = tree.lines().collect();
        assert_eq!(
            lines,
            [
                "tessera-controller admit  +0.0 ms  1.0 ms  k8s.pod.name=share-a outcome=mutated",
                "  tessera-controller bind  +30.0 ms  25.0 ms  k8s.node.name=gpu-a devices=cuda=GPU-0",
                "    · bound",
                "    tessera-node-agent allocate  +90.0 ms  2.0 ms  feasible=1",
            ],
            "{tree}"
        );
    }

    #[test]
    fn the_receiver_listens_where_pods_reach_it() {
        let ports = Ports::choose("10.0.0.7").unwrap();
        assert!(ports.endpoint().starts_with("http://10.0.0.7:"));
        let config = config(&ports);
        assert!(config.contains(&format!("endpoint: {}", ports.otlp)));
        assert!(config.contains(&format!("endpoint: {}", ports.query)));
        assert!(
            ports.query.starts_with("127.0.0.1:"),
            "the query API stays on loopback"
        );
    }
}
