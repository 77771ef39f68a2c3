//! Tessera's alerting rules and Grafana dashboard (charts/tessera/files/)
//! against promtool and against what the components really export:
//!
//! - `promtool check rules` and `promtool test rules` (e2e/prometheus/), for
//!   the chart's rules and for HAMi's tuning guide's queries and alerts on
//!   series recorded from `make demo`'s node agents;
//! - every dashboard query parses (promtool checks it as a recording rule)
//!   and uses only `tessera_*` series, with the `datasource` and `node`
//!   variables;
//! - every metric name in a rule's or a panel's `expr` is one that a running
//!   `tessera-controller` and `tessera-node-agent` export: both are started
//!   against a real kube-apiserver and kube-scheduler (with a kubelet
//!   simulator for the agent), a GPU pod is admitted, bound and served, and
//!   their `/metrics` `# TYPE` lines are the reference (a family without
//!   samples has none, so the pod gives each family its samples).
//!
//! promtool comes from Debian's `prometheus` package (`hack/node-deps.sh`
//! installs it).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    core::v1::{Node, Pod},
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tessera_api::v1alpha1::GpuNodeConfig;
use tessera_e2e::{
    ControlPlane,
    artifacts::Artifacts,
    free_port,
    kubelet::{KubeletSim, Served},
    process::{Lifetime, Process},
    tools::repo_root,
};

const RULES: &str = "charts/tessera/files/prometheus-rules.yaml";
const RULE_TESTS: &str = "e2e/prometheus/rules_test.yaml";
const GUIDE_RULES: &str = "e2e/prometheus/tuning-guide-rules.yaml";
const GUIDE_TESTS: &str = "e2e/prometheus/tuning_guide_test.yaml";
/// kube-state-metrics' series, which the tuning guide's Pending alert reads
/// and no Tessera component exports (docs/observability.md says so and
/// gives Tessera's equivalent).
const KUBE_STATE_METRICS: &str = "kube_";
const DASHBOARD: &str = "charts/tessera/files/dashboards/tessera.json";
const WAIT: Duration = Duration::from_secs(60);

/// promtool, or a failure that says how to install it.
fn promtool() -> PathBuf {
    tessera_e2e::tools::system_program("promtool", "prometheus").unwrap_or_else(|e| panic!("{e}"))
}

/// Runs promtool with `args` in the repository root, failing with its output.
fn run_promtool(args: &[&str]) -> String {
    let output = Command::new(promtool())
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

// ---------------------------------------------------------------------------
// Metric names in PromQL

/// PromQL words that are not metric names.
const KEYWORDS: [&str; 14] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
];

/// Removes every `open … close` span (not nested) from `text`.
fn strip_spans(text: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    for c in text.chars() {
        match (inside, c) {
            (false, c) if c == open => inside = true,
            (true, c) if c == close => {
                inside = false;
                out.push(' ');
            }
            (false, c) => out.push(c),
            (true, _) => {}
        }
    }
    out
}

/// Removes string literals ("…", '…', `…`), honouring backslash escapes.
fn strip_strings(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in text.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q != '`' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                    out.push(' ');
                }
            }
            None if matches!(c, '"' | '\'' | '`') => quote = Some(c),
            None => out.push(c),
        }
    }
    out
}

/// Removes grouping clauses (`by (…)`, `without (…)`, `on (…)`,
/// `ignoring (…)`, `group_left (…)`, `group_right (…)`): their label lists
/// hold no metric names, and `sum by (x) (…)` then reads as a call.
fn strip_grouping(text: &str) -> String {
    const CLAUSES: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = text.chars().collect();
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if !is_part(chars[i]) || (i > 0 && is_part(chars[i - 1])) {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_part(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut next = i;
        while next < chars.len() && chars[next].is_whitespace() {
            next += 1;
        }
        if CLAUSES.contains(&word.to_ascii_lowercase().as_str()) && chars.get(next) == Some(&'(') {
            i = chars[next..]
                .iter()
                .position(|&c| c == ')')
                .map_or(chars.len(), |p| next + p + 1);
            out.push(' ');
        } else {
            out.push_str(&word);
        }
    }
    out
}

/// The metric names a PromQL expression (Grafana variables allowed) reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // String literals, label matchers, durations and grouping label lists
    // hold no metric names.
    let text = strip_spans(&strip_spans(&strip_strings(expr), '{', '}'), '[', ']');
    let chars: Vec<char> = strip_grouping(&text).chars().collect();
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // A Grafana variable ($node, ${node}, $__rate_interval).
        if c == '$' {
            i += 1;
            while i < chars.len() && (is_part(chars[i]) || matches!(chars[i], '{' | '}')) {
                i += 1;
            }
            continue;
        }
        // A number or duration (1e3, 0.05, 5m): skip it whole.
        if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (is_part(chars[i]) || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if !is_start(c) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_part(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut next = i;
        while next < chars.len() && chars[next].is_whitespace() {
            next += 1;
        }
        let is_call = chars.get(next) == Some(&'(');
        if is_call || KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) {
            continue; // a function, an aggregation or an operator
        }
        names.insert(word);
    }
    names
}

/// The metric name in a Grafana `label_values(<selector>, <label>)` (or a
/// plain PromQL variable query).
fn variable_query_names(query: &str) -> BTreeSet<String> {
    match query.trim().strip_prefix("label_values(") {
        Some(rest) => {
            let inner = rest.strip_suffix(')').unwrap_or(rest);
            match inner.rsplit_once(',') {
                Some((selector, _label)) => metric_names(selector),
                None => BTreeSet::new(), // label_values(label): no metric
            }
        }
        None => metric_names(query),
    }
}

#[test]
fn metric_names_are_found_wherever_promql_puts_them() {
    let names = |expr: &str| -> Vec<String> { metric_names(expr).into_iter().collect() };
    assert_eq!(
        names(
            r#"sum by (node) (rate(tessera_a_total{verb="bind",x=~"a|b"}[5m])) / on (node) group_left (model) tessera_b offset 5m > bool 0.5"#
        ),
        ["tessera_a_total", "tessera_b"]
    );
    assert_eq!(
        names("histogram_quantile(0.99, sum(rate(tessera_h_bucket[$__rate_interval])) by (le))"),
        ["tessera_h_bucket"]
    );
    assert_eq!(
        names(
            r#"tessera_x{node=~"$node"} and on(uuid) tessera_y{node=~"${node}"} unless ignoring(pod) tessera_z"#
        ),
        ["tessera_x", "tessera_y", "tessera_z"]
    );
    assert_eq!(
        names("max(tessera_a) > 300 and 1e3 < min without (pod) (tessera:recorded:rate5m)"),
        ["tessera:recorded:rate5m", "tessera_a"]
    );
    assert_eq!(
        names("sum by (node) (tessera_n) / ignoring (x) group_right (y) avg without(z)(tessera_m)"),
        ["tessera_m", "tessera_n"]
    );
    assert_eq!(
        names(r#"label_replace(tessera_q, "dst", "$1", "src", "(.*)")"#),
        ["tessera_q"]
    );
    assert_eq!(
        variable_query_names("label_values(tessera_gpu_healthy{node!=\"\"}, node)")
            .into_iter()
            .collect::<Vec<_>>(),
        ["tessera_gpu_healthy"]
    );
    assert!(variable_query_names("label_values(node)").is_empty());
}

// ---------------------------------------------------------------------------
// Where the rules and the dashboard use them

/// Every `expr` of the rules file, with the alert or record it belongs to.
fn rule_exprs() -> Vec<(String, String)> {
    let mut exprs = rule_file_exprs(RULES);
    exprs.extend(rule_file_exprs(GUIDE_RULES));
    // The guide's queries, as its tests run them.
    let text = std::fs::read_to_string(repo_root().join(GUIDE_TESTS)).unwrap();
    let file: Value = serde_yaml_ng::from_str(&text).unwrap();
    for test in file["tests"].as_array().expect("tests") {
        for query in test["promql_expr_test"].as_array().into_iter().flatten() {
            let expr = query["expr"].as_str().expect("expr");
            exprs.push((format!("{GUIDE_TESTS}: {expr}"), expr.to_owned()));
        }
    }
    exprs
}

fn rule_file_exprs(path: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
    let file: Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for group in file["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            let expr = rule["expr"].as_str().expect("expr");
            exprs.push((format!("rule {name}"), expr.to_owned()));
        }
    }
    exprs
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap();
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every panel query of the dashboard (`expr`, in nested rows too), with
/// the panel's title.
fn panel_exprs(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(value: &Value, title: &str, out: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", Value::String(expr)) => {
                            out.push((format!("panel {title:?}"), expr.clone()));
                        }
                        ("templating", _) => {}
                        _ => walk(value, title, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, title, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, "", &mut out);
    out
}

/// The metric names of the dashboard's variable queries, by variable.
fn variable_names(dashboard: &Value) -> Vec<(String, BTreeSet<String>)> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let query = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .or(v["definition"].as_str())
                .unwrap_or_default();
            (
                format!("variable ${}", v["name"].as_str().unwrap_or_default()),
                variable_query_names(query),
            )
        })
        .collect()
}

/// Every metric name the rules and the dashboard use, with where.
fn used_metrics() -> BTreeMap<String, Vec<String>> {
    let dashboard = dashboard();
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let exprs = rule_exprs()
        .into_iter()
        .chain(panel_exprs(&dashboard))
        .map(|(place, expr)| (place, metric_names(&expr)))
        .chain(variable_names(&dashboard));
    for (place, names) in exprs {
        assert!(!names.is_empty(), "{place} reads no metric");
        for name in names
            .into_iter()
            .filter(|n| !n.starts_with(KUBE_STATE_METRICS))
        {
            used.entry(name).or_default().push(place.clone());
        }
    }
    used
}

/// The promtool tests `tests` (read from `path`) make `alert` fire and
/// check that it stays quiet.
#[track_caller]
fn assert_fires_and_stays_quiet(tests: &str, path: &str, alert: &str) {
    assert!(
        tests.contains(&format!(
            "alertname: {alert}\n        exp_alerts:\n          - exp_labels"
        )),
        "{path} never makes {alert} fire"
    );
    assert!(
        tests.contains(&format!("alertname: {alert}\n        exp_alerts: []")),
        "{path} never checks that {alert} stays quiet"
    );
}

#[test]
fn promtool_checks_and_tests_the_alerting_rules() {
    let checked = run_promtool(&["check", "rules", RULES]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run_promtool(&["test", "rules", RULE_TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    let checked = run_promtool(&["check", "rules", GUIDE_RULES]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run_promtool(&["test", "rules", GUIDE_TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // The guide's tests read series recorded from the demo's agents, and
    // make both of its alerts fire and stay quiet.
    let guide = std::fs::read_to_string(repo_root().join(GUIDE_TESTS)).unwrap();
    let recorded = guide
        .split_once("# BEGIN recorded\n")
        .and_then(|(_, rest)| rest.split_once("# END recorded"))
        .map(|(block, _)| block)
        .expect("a recorded block");
    let series = recorded
        .lines()
        .filter(|l| l.trim_start().starts_with("- series: 'hami_vgpu_"))
        .count();
    assert!(series >= 10, "{GUIDE_TESTS}: {series} recorded HAMi series");
    for alert in ["HAMiGPUMemoryHigh", "HAMiGPUPodPending"] {
        assert_fires_and_stays_quiet(&guide, GUIDE_TESTS, alert);
    }

    // Every alert is exercised by the rule tests, and says how bad it is.
    let tests = std::fs::read_to_string(repo_root().join(RULE_TESTS)).unwrap();
    let text = std::fs::read_to_string(repo_root().join(RULES)).unwrap();
    let file: Value = serde_yaml_ng::from_str(&text).unwrap();
    for rule in file["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
    {
        let Some(alert) = rule["alert"].as_str() else {
            continue;
        };
        assert_fires_and_stays_quiet(&tests, RULE_TESTS, alert);
        assert!(
            matches!(
                rule["labels"]["severity"].as_str(),
                Some("warning" | "critical")
            ),
            "{alert}: severity"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{alert}: {annotation}"
            );
        }
        assert!(rule["for"].as_str().is_some(), "{alert}: for");
    }
}

#[test]
fn dashboard_queries_parse_and_read_only_tessera_series() {
    let dashboard = dashboard();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        variables.contains(&"datasource") && variables.contains(&"node"),
        "{variables:?}"
    );

    // Each query as a recording rule, Grafana's variables replaced, so
    // promtool parses it.
    let exprs = panel_exprs(&dashboard);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| {
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("${node}", ".*")
                .replace("$node", ".*");
            assert!(!expr.contains('$'), "an unknown variable in {expr}");
            json!({"record": format!("tessera_dashboard:query_{i}"), "expr": expr})
        })
        .collect();
    let file = std::env::temp_dir().join(format!(
        "tessera-dashboard-rules-{}.yaml",
        std::process::id()
    ));
    let yaml =
        serde_yaml_ng::to_string(&json!({"groups": [{"name": "dashboard", "rules": rules}]}))
            .unwrap();
    std::fs::write(&file, yaml).unwrap();
    let checked = run_promtool(&["check", "rules", &file.display().to_string()]);
    let _ = std::fs::remove_file(&file);
    assert!(checked.contains("SUCCESS"), "{checked}");

    // Every panel reads from the chosen data source.
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {}",
            panel["title"]
        );
    }
    // Only Tessera's own series: the agent's HAMi-named ones may change.
    let foreign: Vec<String> = panel_exprs(&dashboard)
        .iter()
        .flat_map(|(_, expr)| metric_names(expr))
        .chain(variable_names(&dashboard).into_iter().flat_map(|(_, n)| n))
        .filter(|name| !name.starts_with("tessera_"))
        .collect();
    assert!(foreign.is_empty(), "not tessera_* series: {foreign:?}");
}

// ---------------------------------------------------------------------------
// Against the running components

/// Waits until `GET path` answers 200 with a body for which `check` holds.
async fn wait_for_body(
    port: u16,
    path: &str,
    what: &str,
    log: &Path,
    check: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(body) = tessera_e2e::http::get_body(&format!("127.0.0.1:{port}"), path).await
            && check(&body)
        {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {WAIT:?}; log:\n{}",
            tessera_e2e::process::log_tail(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The metric families of a `/metrics` text: name → type, from `# TYPE`.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some((name.to_owned(), kind.trim().to_owned()))
        })
        .collect()
}

/// Whether a series named `name` comes from one of `families`: a gauge by
/// its own name, a counter as `<family>_total`, a histogram or summary as
/// `<family>_bucket`/`_sum`/`_count`.
fn exported(name: &str, families: &BTreeMap<String, String>) -> bool {
    let kind_of = |family: &str| families.get(family).map(String::as_str);
    let suffixed = |suffix: &str, kinds: &[&str]| {
        name.strip_suffix(suffix)
            .and_then(kind_of)
            .is_some_and(|kind| kinds.contains(&kind))
    };
    matches!(
        kind_of(name),
        Some("gauge" | "untyped" | "unknown" | "stateset")
    ) || suffixed("_total", &["counter"])
        || suffixed("_created", &["counter", "histogram", "summary"])
        || suffixed("_bucket", &["histogram", "gaugehistogram"])
        || suffixed("_sum", &["histogram", "summary"])
        || suffixed("_count", &["histogram", "summary"])
        || suffixed("_info", &["info"])
}

#[test]
fn exported_series_follow_the_openmetrics_suffixes() {
    let families = families(
        "# TYPE tessera_c counter\n# TYPE tessera_h histogram\n# TYPE tessera_g gauge\ntessera_g 1\n",
    );
    for name in [
        "tessera_c_total",
        "tessera_h_bucket",
        "tessera_h_sum",
        "tessera_h_count",
        "tessera_g",
    ] {
        assert!(exported(name, &families), "{name}");
    }
    for name in ["tessera_c", "tessera_h", "tessera_g_total", "tessera_x"] {
        assert!(!exported(name, &families), "{name}");
    }
}

/// Starts `tessera-controller` as the chart runs it: the extender on
/// loopback, metrics and probes on `--metrics-addr`, the agents' Leases
/// watched in `kube-node-lease`, the agents' pods in `default`; the tuning
/// advice every second over a minute, after 3 s of observation. Registers
/// its webhook and starts kube-scheduler with the extender. Returns the
/// metrics port and the log.
async fn start_controller(plane: &ControlPlane, artifacts: &Artifacts) -> (u16, u16, PathBuf) {
    let metrics = free_port().unwrap();
    let profiling = free_port().unwrap();
    let extender = free_port().unwrap();
    let webhook = free_port().unwrap();
    let log = plane.dir().join("tessera-controller.log");
    let pki = plane.pki();
    let args: Vec<String> = vec![
        format!("--extender-addr=127.0.0.1:{extender}"),
        format!("--webhook-addr=127.0.0.1:{webhook}"),
        format!("--metrics-addr=127.0.0.1:{metrics}"),
        format!("--tls-cert-file={}", pki.serving_cert.display()),
        format!("--tls-key-file={}", pki.serving_key.display()),
        "--lease-namespace=kube-system".to_owned(),
        "--agent-lease-namespace=kube-node-lease".to_owned(),
        "--agent-namespace=default".to_owned(),
        "--tuning-interval-seconds=1".to_owned(),
        "--tuning-window-seconds=60".to_owned(),
        "--tuning-min-observed-seconds=3".to_owned(),
        "--profiling".to_owned(),
        format!("--profiling-addr=127.0.0.1:{profiling}"),
    ];
    let kubeconfig = plane.kubeconfig().display().to_string();
    let controller = Process::spawn_with_env(
        "tessera-controller",
        &artifacts.controller,
        &args,
        &[("KUBECONFIG", &kubeconfig), ("TESSERA_LOG", "info")],
        log.clone(),
        Lifetime::Tied,
    )
    .unwrap();
    plane.adopt(controller);
    wait_for_body(
        metrics,
        "/readyz",
        "the controller's /readyz on --metrics-addr",
        &log,
        |_| true,
    )
    .await;

    let ca = std::fs::read(&pki.ca_cert).unwrap();
    let configuration = tessera_e2e::stack::webhook_configuration(
        &format!("https://127.0.0.1:{webhook}/mutate"),
        &ca,
    );
    Api::<MutatingWebhookConfiguration>::all(plane.client().await.unwrap())
        .patch(
            "tessera",
            &PatchParams::apply("tessera-e2e").force(),
            &Patch::Apply(configuration),
        )
        .await
        .unwrap();
    plane
        .start_scheduler(&tessera_e2e::stack::scheduler_config(extender))
        .await
        .unwrap();
    (metrics, profiling, log)
}

/// A GPU node: its Node, a kubelet simulator, and the agent with two fake
/// GPUs (one unhealthy) and `gpuCorePolicy: force` (so a container's compute
/// limit is enforced, and its use measured, on a GPU it has to itself).
/// Returns the simulator, the agent's metrics and profiling ports and its
/// log.
async fn start_node(
    plane: &ControlPlane,
    artifacts: &Artifacts,
    node: &str,
) -> (KubeletSim, u16, u16, PathBuf) {
    let client = plane.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let object = serde_json::from_value(json!({
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}],
        },
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &object).await.unwrap();
    let host = plane.dir().join(node);
    std::fs::create_dir_all(&host).unwrap();
    let kubelet = KubeletSim::start(client, node, &host.join("device-plugins"), "nvidia.com/gpu")
        .await
        .unwrap();
    let gpus = host.join("gpus.yaml");
    std::fs::write(
        &gpus,
        format!(
            "devices:\n\
             - {{uuid: GPU-{node}-0, index: 0, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920}}\n\
             - {{uuid: GPU-{node}-1, index: 1, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, health: Unhealthy}}\n"
        ),
    )
    .unwrap();
    let defaults = host.join("defaults.yaml");
    std::fs::write(&defaults, "gpuCorePolicy: force\n").unwrap();
    let metrics = free_port().unwrap();
    let profiling = free_port().unwrap();
    let log = host.join("agent.log");
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--node-name={node}"),
        "--backend=fake".to_owned(),
        format!("--fake-gpus-file={}", gpus.display()),
        format!("--defaults={}", defaults.display()),
        "--gpu-poll-millis=100".to_owned(),
        format!("--device-plugin-dir={}", kubelet.dir().display()),
        "--interposer-library=/opt/tessera/libtessera_vgpu.so".to_owned(),
        format!("--state-dir={}", host.join("state").display()),
        // The kubelet simulator reads the variable; no NVIDIA toolkit.
        "--device-list-strategy=envvar".to_owned(),
        "--accept-envvar-device-selection".to_owned(),
        "--lease-namespace=kube-node-lease".to_owned(),
        format!("--metrics-addr=127.0.0.1:{metrics}"),
        "--profiling".to_owned(),
        format!("--profiling-addr=127.0.0.1:{profiling}"),
    ];
    let agent = Process::spawn(
        "tessera-node-agent",
        &artifacts.agent,
        &args,
        log.clone(),
        Lifetime::Tied,
    )
    .unwrap();
    plane.adopt(agent);
    (kubelet, metrics, profiling, log)
}

/// Stands in for the interposer in a served container: creates its shared
/// region and holds `bytes` on its first GPU (as the container's first
/// `cuMemAlloc` would).
fn use_gpu_memory(served: &Served, bytes: u64) -> tessera_vgpu_region::Region {
    use tessera_vgpu_region::{MAX_DEVICES, Region};
    let (_, dir, _) = served
        .mounts
        .iter()
        .find(|(container_path, _, _)| container_path == "/var/run/tessera/vgpu")
        .unwrap_or_else(|| panic!("no region directory mounted: {:?}", served.mounts));
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut limits = [0u64; MAX_DEVICES];
    limits[0] = 1000 << 20;
    let (region, _) = Region::create_or_open(&dir.join("region"), &limits).unwrap();
    let me = std::process::id();
    let slot = region
        .claim_slot(me, tessera_vgpu_region::process_start_time(me).unwrap_or(0))
        .unwrap();
    region.try_reserve(slot, 0, bytes).unwrap();
    // 20 ms of GPU time, as the interposer's limiter records its launches.
    region.record_compute(0, 20_000_000, 0);
    region
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_dashboard_use_only_metrics_the_components_export() {
    const NODE: &str = "obs-1";
    const POD: &str = "obs-pod";
    let artifacts = Artifacts::locate().unwrap();
    let plane = ControlPlane::start().await.unwrap();
    let (controller, controller_pprof, controller_log) = start_controller(&plane, &artifacts).await;
    let (kubelet, agent, agent_pprof, agent_log) = start_node(&plane, &artifacts, NODE).await;

    // The controller sees the agent's GpuNode Ready and its Lease renewed.
    wait_for_body(
        controller,
        "/metrics",
        "the controller's per-node series for the agent's node",
        &controller_log,
        |text| {
            text.contains(&format!("tessera_gpu_node_ready{{node=\"{NODE}\"}} 1"))
                && text.contains(&format!(
                    "tessera_agent_lease_age_seconds{{node=\"{NODE}\"}}"
                ))
        },
    )
    .await;

    // The agent as the controller finds it in a cluster: its DaemonSet pod on
    // the node, Ready, serving on its metrics port; and a GpuNodeConfig
    // selecting the node, which the tuning advice is written into.
    let client = plane.client().await.unwrap();
    let agent_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let agent_pod = serde_json::from_value(json!({
        "metadata": {"name": "tessera-node-agent-obs", "labels": {"app.kubernetes.io/component": "node-agent"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "node-agent", "image": "example.invalid/agent",
            "ports": [{"name": "http-metrics", "containerPort": agent}]}]},
    }))
    .unwrap();
    agent_pods
        .create(&PostParams::default(), &agent_pod)
        .await
        .unwrap();
    let running = json!({"status": {"phase": "Running", "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "node-agent", "ready": true, "restartCount": 0,
            "image": "example.invalid/agent", "imageID": "", "state": {"running": {}}}]}});
    agent_pods
        .patch_status(
            "tessera-node-agent-obs",
            &PatchParams::default(),
            &Patch::Merge(running),
        )
        .await
        .unwrap();
    let configs: Api<GpuNodeConfig> = Api::all(client.clone());
    let pool = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeConfig",
        "metadata": {"name": "obs-pool"}, "spec": {"nodeNames": [NODE]},
    }))
    .unwrap();
    configs.create(&PostParams::default(), &pool).await.unwrap();

    // A HAMi-style GPU pod: admitted by the webhook, placed and bound by the
    // extender, served by the agent; its container then uses GPU memory.
    let pods: Api<Pod> = Api::namespaced(plane.client().await.unwrap(), "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": POD},
        "spec": {"containers": [{"name": "main", "image": "example.invalid/cuda",
            "resources": {"limits": {"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "30"}}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let state = kubelet
        .wait_for("the agent's Allocate for the GPU pod", WAIT, |s| {
            s.served.iter().any(|c| c.pod == POD) || !s.failures.is_empty()
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}; agent log:\n{}",
                tessera_e2e::process::log_tail(&agent_log, 40)
            )
        });
    assert!(state.failures.is_empty(), "{:?}", state.failures);
    let served = state.served.iter().find(|c| c.pod == POD).unwrap();
    let _region = use_gpu_memory(served, 300 << 20);
    // And one no GPU has room for beside it (81,000 of 81,920 MiB): it waits.
    let big = serde_json::from_value(json!({
        "metadata": {"name": "obs-too-big"},
        "spec": {"containers": [{"name": "main", "image": "example.invalid/cuda",
            "resources": {"limits": {"nvidia.com/gpumem": "81000"}}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &big).await.unwrap();

    let agent_text = wait_for_body(
        agent,
        "/metrics",
        "the agent's GPU and container series",
        &agent_log,
        |text| {
            // The compute use needs two reads 5 s apart.
            text.contains("tessera_gpu_healthy{")
                && text.contains(&format!(
                    "tessera_container_memory_used_bytes{{namespace=\"default\",pod=\"{POD}\""
                ))
                && text.contains("hami_vgpu_core_used_percent{")
        },
    )
    .await;
    let controller_text = wait_for_body(
        controller,
        "/metrics",
        "the controller's counts of the GPU pod",
        &controller_log,
        |text| {
            text.contains("tessera_webhook_requests_total{outcome=\"mutated\"} 2")
                && text.contains("tessera_extender_request_duration_seconds_count{verb=\"bind\",outcome=\"ok\"} 1")
                && text.contains(
                    "tessera_gpu_pod_waiting_seconds{namespace=\"default\",pod=\"obs-too-big\",lack=\"memory\"}",
                )
        },
    )
    .await;

    let mut known = families(&controller_text);
    known.extend(families(&agent_text));
    let missing: Vec<String> = used_metrics()
        .into_iter()
        .filter(|(name, _)| !exported(name, &known))
        .map(|(name, places)| format!("{name} (in {})", places.join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "series no component exports:\n  {}\nexported families: {:?}",
        missing.join("\n  "),
        known.keys().collect::<Vec<_>>()
    );

    // The tuning advice, from the agent's metrics: the pod holds 300 of its
    // 1000 MiB (30 %: the guide raises the scaling toward 60 %, at most
    // double) and runs no kernel under its 30 % compute limit.
    let text = wait_for_body(
        controller,
        "/metrics",
        "the tuning advice for obs-pool",
        &controller_log,
        |text| {
            text.contains(r#"tessera_tuning_advice{pool="obs-pool",setting="deviceMemoryScaling",from="1.0",to="2.0"} 1"#)
                && text.contains(r#"tessera_tuning_advice{pool="obs-pool",setting="gpucores",from="",to=""} 1"#)
        },
    )
    .await;
    assert!(
        text.contains(r#"tessera_tuning_compute_used_p95_percent{pool="obs-pool"} 0"#),
        "{text}"
    );
    // Written once: the advice as it stood then (the compute use may not
    // have been measured yet; the next write comes 10 minutes later).
    let deadline = Instant::now() + WAIT;
    let tuning = loop {
        let config = configs.get("obs-pool").await.unwrap();
        if let Some(tuning) = config.status.and_then(|s| s.tuning) {
            break tuning;
        }
        assert!(
            Instant::now() < deadline,
            "obs-pool's status.tuning never written; controller log:\n{}",
            tessera_e2e::process::log_tail(&controller_log, 40)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!((tuning.gpus, tuning.window_seconds), (2, 60), "{tuning:?}");
    assert!(
        tuning.advice[0]
            .message
            .starts_with("deviceMemoryScaling 1.0 → 2.0: p95 memory use"),
        "{tuning:?}"
    );
    assert_eq!(
        tuning.advice.get(1).map(|a| a.setting.as_str()),
        tuning.compute_used_p95_percent.map(|_| "gpucores"),
        "compute advice exactly when compute was measured: {tuning:?}"
    );
    // The configs controller's own status fields stand beside it.
    let status = configs.get("obs-pool").await.unwrap().status.unwrap();
    assert_eq!(status.matched_nodes, [NODE]);

    // Both serve profiles `go tool pprof` reads, as HAMi's `--profiling`.
    profiles_read_by_go_tool_pprof(controller_pprof, "tessera_controllers", controller).await;
    profiles_read_by_go_tool_pprof(agent_pprof, "tessera_node_agent", agent).await;
}

/// `go tool pprof -top` reads the CPU profile (taken while `/metrics` is
/// scraped in a loop, so there is work to sample) and the heap profile of
/// the process serving them on `port`; the CPU samples name the component's
/// own code (`crate_name`).
async fn profiles_read_by_go_tool_pprof(port: u16, crate_name: &str, metrics_port: u16) {
    let scratch = tempfile::tempdir().unwrap();
    let top = |url: String, scratch: PathBuf| {
        tokio::task::spawn_blocking(move || {
            let output = Command::new("go")
                .args(["tool", "pprof", "-top", "-cum", &url])
                .env("PPROF_TMPDIR", &scratch)
                .env("GOTOOLCHAIN", "local")
                .output()
                .expect("run `go tool pprof` (Go must be installed)");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(output.status.success(), "go tool pprof {url}:\n{text}");
            text
        })
    };
    // The heap first: the CPU profiler's sample table (about 140 MB, kept
    // once made) would fill the heap profile.
    let heap = top(
        format!("http://127.0.0.1:{port}/debug/pprof/heap"),
        scratch.path().to_owned(),
    )
    .await
    .unwrap();
    // A test process holds too little for jemalloc's samples (one per
    // 512 KiB) to be sure to land in its own code; profiling/tests/go_pprof.rs
    // checks that they name the code holding the memory.
    assert!(
        heap.contains("Type: inuse_space") && heap.contains("Showing nodes accounting for"),
        "the {crate_name} heap profile:\n{heap}"
    );
    let cpu = top(
        format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=2"),
        scratch.path().to_owned(),
    );
    let load = tokio::spawn(async move {
        loop {
            let _ = tessera_e2e::http::get(&format!("127.0.0.1:{metrics_port}"), "/metrics").await;
        }
    });
    let cpu = cpu.await.unwrap();
    load.abort();
    assert!(
        cpu.contains("Type: cpu") && cpu.contains(crate_name),
        "the {crate_name} CPU profile, taken while /metrics was scraped, shows none of its code:\n{cpu}"
    );
}
