//! Reading the processes and endpoints of a run: a process's memory and CPU
//! time from `/proc`, the API server's and the controller's `/metrics`, and
//! HTTP calls to the extender timed from outside (the HTTP path included).

use std::time::{Duration, Instant};

use kube::Client;
use serde_json::Value;
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

/// A CPU profile of the API server over the next `seconds` (Go's
/// `/debug/pprof/profile`, which kube-apiserver serves to its admins), for
/// `go tool pprof`.
pub async fn apiserver_profile(client: &Client, seconds: u64) -> Result<Vec<u8>, Error> {
    use futures::AsyncReadExt as _;
    let path = format!("/debug/pprof/profile?seconds={seconds}");
    let mut stream = client
        .request_stream(http_get(&path)?)
        .await
        .map_err(Error::kube("profiling the API server"))?;
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .await
        .map_err(Error::io("read", &path))?;
    Ok(bytes)
}

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>, Error> {
    http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| Error::Measure {
            what: path.to_owned(),
            why: e.to_string(),
        })
}

/// The body of `GET http://<addr><path>` as bytes (a profile), or why not.
pub async fn fetch(addr: &str, path: &str) -> Result<Vec<u8>, Error> {
    let what = format!("GET http://{addr}{path}");
    let head = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let (status, body) = exchange(&what, addr, &head, &[]).await?;
    if status != 200 {
        return Err(Error::Measure {
            why: format!("status {status}: {}", String::from_utf8_lossy(&body)),
            what,
        });
    }
    Ok(body)
}

/// Sends `head` and `body` to `addr` on a connection of their own and reads
/// the answer to its end: its status and body (de-chunked). `what` names the
/// request in errors.
async fn exchange(
    what: &str,
    addr: &str,
    head: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), Error> {
    let failed = |why: String| Error::Measure {
        what: what.to_owned(),
        why,
    };
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| failed(e.to_string()))?;
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| failed(e.to_string()))?;
    stream
        .write_all(body)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| failed("no HTTP headers".into()))?;
    let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_off(split + 4);
    if head.contains("transfer-encoding: chunked") {
        Ok((
            status,
            dechunk(&String::from_utf8_lossy(&body)).into_bytes(),
        ))
    } else {
        Ok((status, body))
    }
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

/// Writes the API server has answered so far (`apiserver_request_total`
/// for every verb but reads and watches), whatever their outcome.
pub fn writes(samples: &[Sample]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == "apiserver_request_total")
        .filter(|s| {
            !matches!(
                s.labels.get("verb").map(String::as_str),
                Some("GET" | "LIST" | "WATCH" | "CONNECT")
            )
        })
        .map(|s| s.value)
        .sum()
}

/// Waits until the API server answers fewer than `per_second` writes a
/// second, over two seconds in a row, at most `limit`; returns how long it
/// waited, or `None` when it never got that quiet. kwok keeps writing the
/// background pods' status (retries and repeated stage plays) for a while
/// after every one of them reads Running, and a burst timed during that
/// shares the two cores with it.
pub async fn wait_quiet(
    client: &Client,
    per_second: f64,
    limit: Duration,
) -> Result<Option<Duration>, Error> {
    let started = Instant::now();
    let mut last = writes(&apiserver(client).await?);
    let mut quiet_since: Option<Instant> = None;
    while started.elapsed() < limit {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = writes(&apiserver(client).await?);
        let rate = now - last;
        last = now;
        if rate < per_second {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(1) {
                return Ok(Some(started.elapsed()));
            }
        } else {
            quiet_since = None;
        }
    }
    Ok(None)
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
    let body = serde_json::to_vec(body).map_err(|e| Error::Measure {
        what: format!("POST http://{addr}{path}"),
        why: e.to_string(),
    })?;
    let (status, answer) = post_bytes(addr, path, &body).await?;
    Ok((
        status,
        serde_json::from_slice(&answer).unwrap_or(Value::Null),
    ))
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

/// Filter's answer, as kube-scheduler decodes it (typed, not a JSON tree).
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FilterAnswer {
    #[serde(default)]
    node_names: Option<Vec<String>>,
    #[serde(default)]
    error: String,
}

/// Filter's and Prioritize's arguments with node names.
#[derive(serde::Serialize)]
#[serde(rename_all = "PascalCase")]
struct NamesArgs<'a> {
    pod: &'a Value,
    node_names: &'a [String],
}

/// One of Prioritize's scores.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(dead_code)] // decoded as kube-scheduler decodes it; not read
struct HostScore {
    host: String,
    score: i64,
}

/// How many feasible nodes kube-scheduler looks for before it stops
/// filtering, and so how many names one Filter call sends the extender
/// (`numFeasibleNodesToFind` in kube-scheduler's `schedule_one.go`, with
/// `percentageOfNodesToScore` unset, as the chart leaves it): every node
/// below 100, else 50 % less one point per 125 nodes, at least 5 %, and at
/// least 100 nodes: 420 at 1,000 nodes, 500 at 5,000.
pub fn names_kube_scheduler_sends(nodes: usize) -> usize {
    const MIN_NODES: usize = 100;
    if nodes < MIN_NODES {
        return nodes;
    }
    let percentage = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * percentage / 100).max(MIN_NODES)
}

/// Filter+Prioritize round trips, and the part of each this client spent
/// encoding and decoding JSON (kube-scheduler's side of the wire).
#[derive(Debug, Default)]
pub struct RoundTrips {
    /// Each round trip, from encoding Filter's arguments to decoding
    /// Prioritize's scores.
    pub total: Vec<Duration>,
    /// The client's encoding and decoding within each.
    pub client: Vec<Duration>,
}

/// Times `calls` Filter+Prioritize round trips for `pod` against every
/// node in `nodes`, from outside the controller, encoding and decoding as
/// kube-scheduler does (typed, over one kept-alive connection, as its
/// extender client keeps one).
pub async fn filter_and_prioritize(
    addr: &str,
    pod: &Value,
    nodes: &[String],
    calls: usize,
) -> Result<RoundTrips, Error> {
    let mut out = RoundTrips::default();
    let failed = |what: &str, why: String| Error::Measure {
        what: what.into(),
        why,
    };
    let mut connection = crate::keepalive::Connection::open(addr).await?;
    for _ in 0..calls {
        let started = Instant::now();
        let body = serde_json::to_vec(&NamesArgs {
            pod,
            node_names: nodes,
        })
        .map_err(|e| failed("Filter's arguments", e.to_string()))?;
        let mut client = started.elapsed();
        let (status, answer) = connection.post("/filter", &body).await?;
        let decoding = Instant::now();
        let answer: FilterAnswer = serde_json::from_slice(&answer)
            .map_err(|e| failed("Filter over HTTP", format!("status {status}: {e}")))?;
        if status != 200 || !answer.error.is_empty() {
            return Err(failed(
                "Filter over HTTP",
                format!("status {status}: {}", answer.error),
            ));
        }
        let feasible = answer.node_names.unwrap_or_default();
        let body = serde_json::to_vec(&NamesArgs {
            pod,
            node_names: &feasible,
        })
        .map_err(|e| failed("Prioritize's arguments", e.to_string()))?;
        client += decoding.elapsed();
        let (status, answer) = connection.post("/prioritize", &body).await?;
        let decoding = Instant::now();
        let scores: Vec<HostScore> = serde_json::from_slice(&answer)
            .map_err(|e| failed("Prioritize over HTTP", format!("status {status}: {e}")))?;
        if status != 200 || scores.len() > feasible.len() {
            return Err(failed("Prioritize over HTTP", format!("status {status}")));
        }
        client += decoding.elapsed();
        out.total.push(started.elapsed());
        out.client.push(client);
    }
    Ok(out)
}

/// `POST http://<addr><path>` with a JSON body already encoded; the
/// answer's status and body (de-chunked).
async fn post_bytes(addr: &str, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>), Error> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    exchange(&format!("POST http://{addr}{path}"), addr, &head, body).await
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
    fn kube_scheduler_sends_a_share_of_the_nodes_that_shrinks_with_the_fleet() {
        assert_eq!(names_kube_scheduler_sends(50), 50);
        assert_eq!(names_kube_scheduler_sends(100), 100);
        assert_eq!(names_kube_scheduler_sends(1_000), 420);
        assert_eq!(names_kube_scheduler_sends(5_000), 500);
        assert_eq!(names_kube_scheduler_sends(10_000), 500);
        assert_eq!(names_kube_scheduler_sends(100_000), 5_000);
    }

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
    fn writes_count_every_verb_but_reads_and_watches() {
        let scrape = crate::prom::parse(concat!(
            "# TYPE apiserver_request_total counter\n",
            "apiserver_request_total{code=\"201\",resource=\"pods\",verb=\"POST\"} 10\n",
            "apiserver_request_total{code=\"200\",resource=\"pods\",subresource=\"status\",verb=\"PATCH\"} 7\n",
            "apiserver_request_total{code=\"409\",resource=\"nodelocks\",verb=\"PUT\"} 2\n",
            "apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"LIST\"} 100\n",
            "apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"GET\"} 100\n",
            "apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"WATCH\"} 100\n",
            "apiserver_request_duration_seconds_count{verb=\"POST\"} 1000\n",
        ));
        assert_eq!(writes(&scrape), 19.0);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
