//! Reading the processes and endpoints of a run: a process's memory and CPU
//! time from `/proc`, the API server's and the controller's `/metrics`, and
//! HTTP calls to the extender timed from outside (the HTTP path included).

use std::time::{Duration, Instant};

use kube::Client;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    Error,
    prom::{self, Sample},
};

/// A process's resident memory now and at its peak, and CPU time so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// `VmRSS`, MiB.
    pub rss_mib: f64,
    /// `VmHWM` (peak resident), MiB.
    pub peak_rss_mib: f64,
    /// User + system CPU seconds.
    pub cpu_seconds: f64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
pub fn process(pid: u32) -> Result<ProcessStats, Error> {
    let status_path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&status_path).map_err(Error::io("read", &status_path))?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat_path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&stat_path).map_err(Error::io("read", &stat_path))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ")".
    let hz = 100.0; // USER_HZ on Linux
    Ok(ProcessStats {
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_rss_mib: kib("VmHWM:") / 1024.0,
        cpu_seconds: (ticks(11) + ticks(12)) / hz,
    })
}

/// The API server's `/metrics`.
pub async fn apiserver(client: &Client) -> Result<Vec<Sample>, Error> {
    let request = http_get("/metrics")?;
    let text = client
        .request_text(request)
        .await
        .map_err(Error::kube("scraping the API server's /metrics"))?;
    Ok(prom::parse(&text))
}

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>, Error> {
    http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| Error::Measure {
            what: path.to_owned(),
            why: e.to_string(),
        })
}

/// tessera-controller's `/metrics` on `addr`.
pub async fn controller(addr: &str) -> Result<Vec<Sample>, Error> {
    let text = tessera_e2e::http::get_body(addr, "/metrics")
        .await
        .map_err(|why| Error::Measure {
            what: "the controller's /metrics".into(),
            why,
        })?;
    Ok(prom::parse(&text))
}

/// `apiserver_request_total` by `VERB resource[/subresource]`, between two
/// scrapes, only what changed.
pub fn requests_between(before: &[Sample], after: &[Sample]) -> Vec<(String, f64)> {
    let key = |s: &Sample| {
        let label = |k: &str| s.labels.get(k).map_or("", String::as_str);
        let sub = label("subresource");
        let resource = if sub.is_empty() {
            label("resource").to_owned()
        } else {
            format!("{}/{sub}", label("resource"))
        };
        // Refusals and failures apart: they are retries, not work.
        match label("code") {
            code if code.starts_with('2') || code.is_empty() => {
                format!("{} {resource}", label("verb"))
            }
            code => format!("{} {resource} ({code})", label("verb")),
        }
    };
    let mut totals = std::collections::BTreeMap::<String, f64>::new();
    for s in after.iter().filter(|s| s.name == "apiserver_request_total") {
        *totals.entry(key(s)).or_default() += s.value;
    }
    for s in before
        .iter()
        .filter(|s| s.name == "apiserver_request_total")
    {
        *totals.entry(key(s)).or_default() -= s.value;
    }
    totals.into_iter().filter(|(_, n)| *n > 0.5).collect()
}

/// The counters of the controller's extender that say something failed,
/// between two scrapes: `<verb> error` for each verb that answered an
/// error, and `rollback <reason>` for each Bind undone.
pub fn failures_between(before: &[Sample], after: &[Sample]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let verbs = "tessera_extender_request_duration_seconds_count";
    for verb in ["filter", "prioritize", "bind"] {
        let labels = [("verb", verb), ("outcome", "error")];
        let n = prom::sum(after, verbs, &labels) - prom::sum(before, verbs, &labels);
        if n > 0.5 {
            out.push((format!("{verb} error"), n));
        }
    }
    let mut reasons: Vec<&str> = after
        .iter()
        .filter(|s| s.name == "tessera_bind_rollbacks_total")
        .filter_map(|s| s.labels.get("reason").map(String::as_str))
        .collect();
    reasons.sort_unstable();
    reasons.dedup();
    for reason in reasons {
        let labels = [("reason", reason)];
        let name = "tessera_bind_rollbacks_total";
        let n = prom::sum(after, name, &labels) - prom::sum(before, name, &labels);
        if n > 0.5 {
            out.push((format!("rollback {reason}"), n));
        }
    }
    out
}

/// `POST http://<addr><path>` with a JSON body; the answer's status and body.
pub async fn post_json(addr: &str, path: &str, body: &Value) -> Result<(u16, Value), Error> {
    let failed = |why: String| Error::Measure {
        what: format!("POST http://{addr}{path}"),
        why,
    };
    let body = serde_json::to_vec(body).map_err(|e| failed(e.to_string()))?;
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| failed(e.to_string()))?;
    stream
        .write_all(&body)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    let value = serde_json::from_str(&body).unwrap_or(Value::Null);
    Ok((status, value))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

/// Times `calls` Filter+Prioritize round trips for `pod` against every
/// node in `nodes`, from outside the controller; returns each round trip.
pub async fn filter_and_prioritize(
    addr: &str,
    pod: &Value,
    nodes: &[String],
    calls: usize,
) -> Result<Vec<Duration>, Error> {
    let args = json!({"Pod": pod, "NodeNames": nodes});
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let (status, answer) = post_json(addr, "/filter", &args).await?;
        let feasible = answer["NodeNames"].clone();
        if status != 200 || !answer["Error"].as_str().unwrap_or("").is_empty() {
            return Err(Error::Measure {
                what: "Filter over HTTP".into(),
                why: format!("status {status}: {answer}"),
            });
        }
        let args = json!({"Pod": pod, "NodeNames": feasible});
        let (status, _) = post_json(addr, "/prioritize", &args).await?;
        if status != 200 {
            return Err(Error::Measure {
                what: "Prioritize over HTTP".into(),
                why: format!("status {status}"),
            });
        }
        times.push(started.elapsed());
    }
    Ok(times)
}

/// The `q` quantile of `times` (nearest rank), in milliseconds.
pub fn percentile_ms(times: &[Duration], q: f64) -> f64 {
    let mut sorted: Vec<f64> = times.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_readable() {
        let stats = process(std::process::id()).unwrap();
        assert!(stats.rss_mib > 0.0 && stats.peak_rss_mib >= stats.rss_mib);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let times: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&times, 0.5), 50.0);
        assert_eq!(percentile_ms(&times, 0.99), 99.0);
        assert_eq!(percentile_ms(&times, 1.0), 100.0);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
