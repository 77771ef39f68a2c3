//! Just enough of the Prometheus text format to read counters and
//! histograms from `/metrics` (the API server's and tessera-controller's),
//! subtract two scrapes and estimate quantiles from histogram buckets.

use std::collections::BTreeMap;

/// One sample: metric name, labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric's name (with `_bucket`, `_sum`, `_count` suffixes kept).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Every sample of a scrape, comments and malformed lines skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, rest) = match line.find('{') {
        Some(open) => {
            let close = line[open..].find('}')? + open;
            (&line[..=close], &line[close + 1..])
        }
        None => line.split_at(line.find(' ')?),
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (name, parse_labels(labels.strip_suffix('}')?)?),
        None => (series, BTreeMap::new()),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = after[end + 1..].trim_start_matches(',').trim();
    }
    Some(labels)
}

/// The sum of the samples named `name` whose labels include `matching`.
pub fn sum(samples: &[Sample], name: &str, matching: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && matches(s, matching))
        .map(|s| s.value)
        .sum()
}

fn matches(sample: &Sample, matching: &[(&str, &str)]) -> bool {
    matching
        .iter()
        .all(|(k, v)| sample.labels.get(*k).is_some_and(|x| x == v))
}

/// A histogram's cumulative buckets (upper bound, count), summed over the
/// series matching `matching`, ascending, `+Inf` last.
pub fn buckets(samples: &[Sample], name: &str, matching: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let mut by_bound: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    let bucket = format!("{name}_bucket");
    for s in samples
        .iter()
        .filter(|s| s.name == bucket && matches(s, matching))
    {
        let Some(bound) = s.labels.get("le").and_then(|le| le.parse::<f64>().ok()) else {
            continue;
        };
        by_bound.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += s.value;
    }
    let mut out: Vec<(f64, f64)> = by_bound.into_values().collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// `after - before`, bucket by bucket (the observations between scrapes).
pub fn delta(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|&(bound, count)| {
            let earlier = before
                .iter()
                .find(|(b, _)| b.to_bits() == bound.to_bits())
                .map_or(0.0, |(_, c)| *c);
            (bound, count - earlier)
        })
        .collect()
}

/// The `q` quantile (0..1) of cumulative `buckets`, interpolated linearly
/// inside the bucket it falls in, as PromQL's `histogram_quantile` does;
/// `None` without observations. A quantile in the `+Inf` bucket is the
/// highest finite bound.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let width = count - lower.1;
            let within = if width > 0.0 {
                (rank - lower.1) / width
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * within);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP x
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 12
apiserver_request_total{code="200",resource="pods",subresource="binding",verb="POST"} 3
tessera_h_bucket{verb="filter",le="0.001"} 50
tessera_h_bucket{verb="filter",le="0.01"} 90
tessera_h_bucket{verb="filter",le="+Inf"} 100
tessera_h_bucket{verb="bind",le="0.001"} 1
tessera_h_bucket{verb="bind",le="0.01"} 1
tessera_h_bucket{verb="bind",le="+Inf"} 1
plain 4.5
weird{a="x\"y,z"} 1
"#;

    #[test]
    fn counters_and_labels_are_read() {
        let samples = parse(TEXT);
        assert_eq!(
            sum(&samples, "apiserver_request_total", &[("resource", "pods")]),
            15.0
        );
        assert_eq!(
            sum(
                &samples,
                "apiserver_request_total",
                &[("subresource", "binding")]
            ),
            3.0
        );
        assert_eq!(sum(&samples, "plain", &[]), 4.5);
        assert_eq!(sum(&samples, "weird", &[("a", "x\"y,z")]), 1.0);
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let samples = parse(TEXT);
        let filter = buckets(&samples, "tessera_h", &[("verb", "filter")]);
        assert_eq!(
            filter,
            vec![(0.001, 50.0), (0.01, 90.0), (f64::INFINITY, 100.0)]
        );
        let p50 = quantile(&filter, 0.5).unwrap();
        assert!((p50 - 0.001).abs() < 1e-12, "{p50}");
        let p70 = quantile(&filter, 0.7).unwrap();
        assert!((p70 - 0.0055).abs() < 1e-9, "{p70}");
        assert_eq!(quantile(&filter, 0.99), Some(0.01));
        let all = buckets(&samples, "tessera_h", &[]);
        assert_eq!(all[0], (0.001, 51.0));
        let none = delta(&filter, &filter);
        assert_eq!(quantile(&none, 0.5), None);
    }
}
