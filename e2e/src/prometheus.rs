//! Prometheus for the demo: Debian's `prometheus` package, started beside
//! the control plane, scraping Tessera's controller and node agents on the
//! pod network, and its HTTP API read back: instant queries for the tour and
//! range queries to record series for `promtool test rules`
//! ([`input_series`]). Debian builds Prometheus without Kubernetes service
//! discovery, so the targets are the pods' addresses written to file-based
//! discovery files when it starts ([`Targets`]), as the chart's
//! ServiceMonitors select them (the `http-metrics` port).

use std::{collections::BTreeMap, fmt::Write as _, path::Path, time::Duration};

use serde::Deserialize;

use crate::{ControlPlane, error::Error, free_port, http};

/// How often Prometheus scrapes, and the step [`record`] reads at.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(15);

/// A running Prometheus: its address (`127.0.0.1:<port>`).
#[derive(Clone, Debug)]
pub struct Prometheus {
    addr: String,
}

/// What Prometheus scrapes: `(instance, host:port)` per node agent (the
/// instance is its node) and per controller replica (its pod).
#[derive(Clone, Debug, Default)]
pub struct Targets {
    /// The node agents' metrics endpoints, by node.
    pub agents: Vec<(String, String)>,
    /// The controller replicas' metrics endpoints, by pod.
    pub controllers: Vec<(String, String)>,
}

/// The scrape configuration, reading its targets from `dir`. Series keep
/// their own `pod` and `namespace` labels (the workload's, as HAMi's
/// dashboards read them), as the chart's ServiceMonitors have it; the
/// controller's other series get the replica's pod.
pub fn config(dir: &Path) -> String {
    let job = |name: &str| {
        format!(
            "  - job_name: {name}\n    honor_labels: true\n    file_sd_configs:\n      - files: [{}]\n",
            dir.join(format!("{name}.json")).display()
        )
    };
    format!(
        "global:\n  scrape_interval: {s}s\n  evaluation_interval: {s}s\nscrape_configs:\n{}{}",
        job("tessera-node-agent"),
        job("tessera-controller"),
        s = SCRAPE_INTERVAL.as_secs(),
    )
}

/// A file-based discovery file: one group per target, its instance label
/// (and for the controller, the replica's `pod`).
fn sd_file(targets: &[(String, String)], label: &str) -> String {
    let groups: Vec<serde_json::Value> = targets
        .iter()
        .map(|(instance, addr)| {
            let mut labels = serde_json::Map::new();
            labels.insert("instance".into(), instance.clone().into());
            if !label.is_empty() {
                labels.insert(label.into(), instance.clone().into());
            }
            serde_json::json!({"targets": [addr], "labels": labels})
        })
        .collect();
    serde_json::Value::from(groups).to_string()
}

impl Prometheus {
    /// Starts Prometheus as one of `plane`'s processes (stopped with it, or
    /// recorded for `tessera-demo down` when the plane is detached) and
    /// waits until it is ready.
    pub async fn start(plane: &ControlPlane, targets: &Targets) -> Result<Self, Error> {
        let dir = plane.dir().join("prometheus");
        std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
        for (name, file) in [
            ("tessera-node-agent", sd_file(&targets.agents, "")),
            ("tessera-controller", sd_file(&targets.controllers, "pod")),
        ] {
            let path = dir.join(format!("{name}.json"));
            std::fs::write(&path, file).map_err(Error::io("write", &path))?;
        }
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config(&dir)).map_err(Error::io("write", &config_path))?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        plane.spawn(
            "prometheus",
            &crate::tools::system_program("prometheus", "prometheus")?,
            &[
                format!("--config.file={}", config_path.display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address={addr}"),
                "--storage.tsdb.retention.time=2d".into(),
            ],
        )?;
        if !http::wait_ok(&addr, "/-/ready", Duration::from_secs(60)).await {
            return Err(Error::Config(format!(
                "prometheus on {addr} not ready within 60 s (see {}/prometheus.log)",
                plane.dir().display()
            )));
        }
        Ok(Self { addr })
    }

    /// A Prometheus already running at `addr`.
    pub fn at(addr: impl Into<String>) -> Self {
        Self { addr: addr.into() }
    }

    /// Its address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// How many scrape targets were scraped and are up (a target appears
    /// in `up` only after its first scrape).
    pub async fn targets_up(&self) -> Result<usize, Error> {
        let samples = self.query("up").await?;
        Ok(samples.iter().filter(|s| s.value == 1.0).count())
    }

    /// An instant query's samples.
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>, Error> {
        let path = format!("/api/v1/query?query={}", http::encode(promql));
        let data: Data<InstantSeries> = self.api(&path).await?;
        data.result
            .into_iter()
            .map(|s| {
                Ok(Sample {
                    value: number(&s.value.1)?,
                    labels: s.metric,
                })
            })
            .collect()
    }

    /// A range query's series, from `start` to `end` (Unix seconds) every
    /// `step`.
    pub async fn query_range(
        &self,
        promql: &str,
        start: u64,
        end: u64,
        step: Duration,
    ) -> Result<Vec<Series>, Error> {
        let path = format!(
            "/api/v1/query_range?query={}&start={start}&end={end}&step={}s",
            http::encode(promql),
            step.as_secs().max(1)
        );
        let data: Data<RangeSeries> = self.api(&path).await?;
        data.result
            .into_iter()
            .map(|s| {
                let values = s
                    .values
                    .into_iter()
                    .map(|(t, v)| Ok((t as u64, number(&v)?)))
                    .collect::<Result<_, Error>>()?;
                Ok(Series {
                    labels: s.metric,
                    values,
                })
            })
            .collect()
    }

    async fn api<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<Data<T>, Error> {
        let body = http::get_body(&self.addr, path)
            .await
            .map_err(Error::Config)?;
        let answer: Answer<T> = serde_json::from_str(&body)
            .map_err(|e| Error::Config(format!("prometheus {path}: {e}: {body}")))?;
        match answer {
            Answer {
                status,
                data: Some(data),
                ..
            } if status == "success" => Ok(data),
            Answer { error, .. } => Err(Error::Config(format!(
                "prometheus {path}: {}",
                error.unwrap_or_default()
            ))),
        }
    }
}

/// One sample of an instant query.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The series' labels, `__name__` included when the query keeps it.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// One series of a range query.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The series' labels, `__name__` included.
    pub labels: BTreeMap<String, String>,
    /// `(Unix seconds, value)`, oldest first.
    pub values: Vec<(u64, f64)>,
}

#[derive(Deserialize)]
struct Answer<T> {
    status: String,
    data: Option<Data<T>>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data<T> {
    result: Vec<T>,
}

#[derive(Deserialize)]
struct InstantSeries {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct RangeSeries {
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

fn number(text: &str) -> Result<f64, Error> {
    text.parse()
        .map_err(|e| Error::Config(format!("prometheus sample {text:?}: {e}")))
}

/// `series` as promtool's `input_series`, one sample per `step` from
/// `start` (Unix seconds): each value where a series has one at that time,
/// `_` where it has none, runs of one value written `vxN` as promtool
/// expands them. Lines are indented for a test's `input_series:` list.
pub fn input_series(series: &[Series], start: u64, steps: usize, step: Duration) -> String {
    let step = step.as_secs().max(1);
    let mut out = String::new();
    for s in series {
        let name = s.labels.get("__name__").cloned().unwrap_or_default();
        let labels: Vec<String> = s
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != "__name__")
            .map(|(k, v)| format!("{k}={}", quote(v)))
            .collect();
        let at: BTreeMap<u64, f64> = s.values.iter().copied().collect();
        let slots: Vec<Option<f64>> = (0..steps as u64)
            .map(|i| at.get(&(start + i * step)).copied())
            .collect();
        let _ = writeln!(
            out,
            "      - series: '{name}{{{}}}'\n        values: '{}'",
            labels.join(","),
            runs(&slots)
        );
    }
    out
}

/// A label value in PromQL's double quotes (inside YAML single quotes).
fn quote(value: &str) -> String {
    let escaped = value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\'', "''");
    format!("\"{escaped}\"")
}

/// promtool's value notation: `_` for a missing sample, `vxN` for `v`
/// followed by N more of the same.
fn runs(slots: &[Option<f64>]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < slots.len() {
        let mut j = i + 1;
        while j < slots.len() && slots[j] == slots[i] {
            j += 1;
        }
        let text = match slots[i] {
            Some(v) => format!("{v}"),
            None => "_".into(),
        };
        parts.push(match j - i {
            1 => text,
            n => format!("{text}x{}", n - 1),
        });
        i = j;
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_promtools_notation() {
        assert_eq!(
            runs(&[Some(1.0), Some(1.0), Some(1.0), None, Some(2.5), None, None]),
            "1x2 _ 2.5 _x1"
        );
        assert_eq!(runs(&[]), "");
    }

    #[test]
    fn series_are_written_with_their_labels_and_gaps() {
        let series = Series {
            labels: [
                ("__name__", "hami_vgpu_memory_used_bytes"),
                ("pod", "share-a"),
                ("container", "it's"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            values: vec![(100, 5.0), (115, 5.0), (145, 7.0)],
        };
        assert_eq!(
            input_series(&[series], 100, 4, Duration::from_secs(15)),
            "      - series: 'hami_vgpu_memory_used_bytes{container=\"it''s\",pod=\"share-a\"}'\n        values: '5x1 _ 7'\n"
        );
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            http::encode("a{b=\"c\"} * 100"),
            "a%7Bb%3D%22c%22%7D%20%2A%20100"
        );
    }
}
