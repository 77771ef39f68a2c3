//! Tuning advice from observed use (HAMi's tuning guide, 性能调优指南 §5.2 and
//! §5.5), computed by the lifecycle's leader and published in each
//! GpuNodeConfig's status and as metrics; never applied (GitOps owns the
//! spec).
//!
//! Every [`Settings::interval`] the leader reads each GPU node's agent
//! `/metrics` (the per-container HAMi series, [`usage`]) and keeps the
//! window's rounds ([`history`]). A pool is the nodes a GpuNodeConfig
//! selects (`status.matchedNodes`), or one node no config selects. For each
//! pool the guide's tree ([`crate::engine::tuning`]) reads the window's
//! 95th percentiles of memory and compute use against limits, and the pods
//! that waited for a GPU over 10 minutes on the pool's nodes (the
//! extender's record, [`crate::projection::waiting`]). A config's status is
//! written when its advice or evidence changed, at most once per
//! [`Settings::write_gap`] (10 minutes).

pub mod history;
pub mod usage;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::reflector::Store,
};
use serde_json::json;
use tessera_api::v1alpha1::{GpuNode, GpuNodeConfig, TuningAdvice, TuningStatus, TuningWait};

pub use crate::projection::advice::{Pool, PoolAdvice};
use crate::{
    engine::{
        Lack,
        tuning::{Advice, Current, Observed, Thresholds, WaitCount, Waited, advise},
    },
    projection::{Projection, waiting::Wait},
};
use history::History;

/// The field manager of the advice in a config's status.
const MANAGER: &str = "tessera-tuning";

/// How often the agents are read, and what the advice looks at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// How often every agent's `/metrics` is read.
    pub interval: Duration,
    /// How far back the advice looks.
    pub window: Duration,
    /// Where the tree's branches are cut (its `min_span`: how long a pool
    /// must have been seen before any advice).
    pub thresholds: Thresholds,
    /// The least time between two writes of one config's advice.
    pub write_gap: Duration,
}

impl Default for Settings {
    /// The flags' defaults: every 5 minutes, over 6 hours, after an hour.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(300),
            window: Duration::from_secs(6 * 3600),
            thresholds: Thresholds::default(),
            write_gap: Duration::from_secs(600),
        }
    }
}

/// The pools of `nodes`: one per config with matched GPU nodes, one per GPU
/// node no config selects.
pub fn pools(configs: &[GpuNodeConfig], nodes: &[GpuNode]) -> Vec<Pool> {
    let by_name: BTreeMap<String, &GpuNode> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let mut selected = BTreeSet::new();
    let mut pools = Vec::new();
    let current = |node: &GpuNode| {
        node.status.as_ref().map(|s| Current {
            memory_scaling: s.settings.device_memory_scaling,
            split_count: s.settings.device_split_count,
            core_policy: s.settings.gpu_core_policy,
        })
    };
    let gpus = |node: &GpuNode| node.status.as_ref().map_or(0, |s| s.gpu_count);
    for config in configs {
        let matched: BTreeSet<String> = config
            .status
            .iter()
            .flat_map(|s| s.matched_nodes.iter())
            .filter(|n| by_name.contains_key(*n))
            .cloned()
            .collect();
        selected.extend(matched.iter().cloned());
        let Some(current) = matched.iter().find_map(|n| current(by_name[n])) else {
            continue; // no GPU node yet
        };
        pools.push(Pool {
            config: Some(config.name_any()),
            name: config.name_any(),
            gpus: matched.iter().map(|n| gpus(by_name[n])).sum(),
            nodes: matched,
            current,
        });
    }
    for (name, node) in &by_name {
        if selected.contains(name) {
            continue;
        }
        let Some(current) = current(node) else {
            continue;
        };
        pools.push(Pool {
            config: None,
            name: format!("node/{name}"),
            nodes: [name.clone()].into(),
            gpus: gpus(node),
            current,
        });
    }
    pools
}

/// The pods of `waits` that waited longer than `over` for a GPU on one of
/// `nodes`, by what those nodes lacked.
pub fn waited(waits: &[Wait], nodes: &BTreeSet<String>, over: Duration, now: Timestamp) -> Waited {
    let mut waited = Waited::default();
    for wait in waits {
        let long = now.duration_since(wait.since).unsigned_abs();
        if long <= over {
            continue;
        }
        let lacks: BTreeSet<Lack> = wait
            .lacking
            .iter()
            .filter(|(node, _)| nodes.contains(node))
            .map(|&(_, lack)| lack)
            .collect();
        for lack in lacks {
            let count = match lack {
                Lack::Slice => &mut waited.slices,
                Lack::Memory => &mut waited.memory,
                Lack::Cores => &mut waited.cores,
            };
            count.pods += 1;
            count.longest = count.longest.max(long);
        }
    }
    waited
}

/// `seconds` as `6h`, `45m` or `30s`: the largest whole unit.
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 3600 => format!("{:.1}h", s as f64 / 3600.0),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One piece of advice in words, with its evidence.
pub fn describe(advice: &Advice, pool: &PoolAdvice) -> TuningAdvice {
    let o = &pool.observed;
    let over = format!(
        "over {} across {} GPU{}",
        span(o.span),
        pool.pool.gpus,
        if pool.pool.gpus == 1 { "" } else { "s" }
    );
    let percent = |p: Option<f64>| p.map_or("?".to_owned(), |p| format!("{p:.0} %"));
    let waits = |w: &WaitCount, what: &str| {
        format!(
            "{} pod{} waited for {what} (longest {})",
            w.pods,
            if w.pods == 1 { "" } else { "s" },
            span(w.longest)
        )
    };
    let (setting, from, to, message) = match advice {
        Advice::RaiseMemoryScaling { from, to } | Advice::LowerMemoryScaling { from, to } => {
            let why = if matches!(advice, Advice::RaiseMemoryScaling { .. }) {
                "or lower the pods' memory requests"
            } else {
                "containers run near their limits on oversubscribed memory"
            };
            (
                "deviceMemoryScaling",
                Some(format!("{from:.1}")),
                Some(format!("{to:.1}")),
                format!(
                    "deviceMemoryScaling {from:.1} → {to:.1}: p95 memory use {} of limits {over} ({why})",
                    percent(o.memory_p95)
                ),
            )
        }
        Advice::LowerCoreLimits => (
            "gpucores",
            None,
            None,
            format!(
                "lower the pods' nvidia.com/gpucores, or gpuCorePolicy: disable: p95 compute use {} of limits {over}",
                percent(o.compute_p95)
            ),
        ),
        Advice::RaiseSplitCount { from, to } => (
            "deviceSplitCount",
            Some(from.to_string()),
            Some(to.to_string()),
            format!(
                "deviceSplitCount {from} → {to}: {} {over}",
                waits(&o.waited.slices, "a free slice")
            ),
        ),
        Advice::AddGpuNodes => {
            let mut why = Vec::new();
            if o.waited.memory.pods > 0 {
                why.push(waits(&o.waited.memory, "memory"));
            }
            if o.waited.cores.pods > 0 {
                why.push(waits(&o.waited.cores, "cores"));
            }
            (
                "nodes",
                None,
                None,
                format!("add GPU nodes: {} {over}", why.join(", ")),
            )
        }
    };
    TuningAdvice {
        setting: setting.to_owned(),
        from,
        to,
        message,
    }
}

/// A config's status for `pool`'s advice, computed at `now`.
pub fn status(pool: &PoolAdvice, window: Duration, now: Timestamp) -> TuningStatus {
    let o = &pool.observed;
    let rounded = |p: Option<f64>| p.map(|p| p.round().clamp(0.0, f64::from(u32::MAX)) as u32);
    let waited = [
        (Lack::Slice, o.waited.slices),
        (Lack::Memory, o.waited.memory),
        (Lack::Cores, o.waited.cores),
    ]
    .into_iter()
    .filter(|(_, w)| w.pods > 0)
    .map(|(lack, w)| TuningWait {
        lack: lack.as_str().to_owned(),
        pods: w.pods,
        longest_seconds: w.longest.as_secs(),
    })
    .collect();
    TuningStatus {
        computed_at: now.to_string(),
        window_seconds: window.as_secs(),
        observed_seconds: o.span.as_secs(),
        gpus: pool.pool.gpus,
        memory_used_p95_percent: rounded(o.memory_p95),
        compute_used_p95_percent: rounded(o.compute_p95),
        waited,
        advice: pool.advice.iter().map(|a| describe(a, pool)).collect(),
    }
}

/// Whether `new` should replace `old` at `now`: when the advice or its
/// numbers changed (how long the pool was seen, and the words carrying it,
/// do not count), and not within `gap` of the last write.
pub fn due(old: Option<&TuningStatus>, new: &TuningStatus, now: Timestamp, gap: Duration) -> bool {
    let Some(old) = old else {
        return true;
    };
    let gist = |s: &TuningStatus| {
        (
            s.window_seconds,
            s.gpus,
            s.memory_used_p95_percent,
            s.compute_used_p95_percent,
            s.waited
                .iter()
                .map(|w| (w.lack.clone(), w.pods))
                .collect::<Vec<_>>(),
            s.advice
                .iter()
                .map(|a| (a.setting.clone(), a.from.clone(), a.to.clone()))
                .collect::<Vec<_>>(),
        )
    };
    if gist(old) == gist(new) {
        return false;
    }
    old.computed_at
        .parse::<Timestamp>()
        .map_or(true, |at| now.duration_since(at).unsigned_abs() >= gap)
}

/// Everything the advice reads, for one round: the pools' advice.
pub fn evaluate(
    history: &History,
    pools: Vec<Pool>,
    waits: &[Wait],
    thresholds: &Thresholds,
    now: Timestamp,
) -> Vec<PoolAdvice> {
    pools
        .into_iter()
        .map(|pool| {
            let seen = history.seen(&pool.nodes);
            let observed = Observed {
                span: seen.span,
                gpus: pool.gpus,
                memory_p95: seen.memory_p95,
                compute_p95: seen.compute_p95,
                waited: waited(waits, &pool.nodes, thresholds.wait, now),
            };
            let advice = advise(&observed, &pool.current, thresholds);
            PoolAdvice {
                pool,
                observed,
                advice,
            }
        })
        .collect()
}

/// The most of an agent's `/metrics` read.
const READ_LIMIT: u64 = 16 << 20;
/// How long an agent has to answer.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /metrics` from an agent at `endpoint` (`ip:port`).
async fn scrape(endpoint: &str) -> Result<String, String> {
    let get = crate::extender::probe::get(endpoint, "/metrics", READ_LIMIT);
    match tokio::time::timeout(SCRAPE_TIMEOUT, get).await {
        Ok(Ok((200, body))) => Ok(body),
        Ok(Ok((status, _))) => Err(format!("answered with status {status}")),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {} s", SCRAPE_TIMEOUT.as_secs())),
    }
}

/// Runs the advice until the future is dropped (leadership lost): reads the
/// agents every interval, publishes every pool's advice for `/metrics`
/// (through the projection) and writes each config's.
pub async fn run(
    client: Client,
    projection: Projection,
    gpu_nodes: Store<GpuNode>,
    configs: Store<GpuNodeConfig>,
    settings: Settings,
) {
    let api: Api<GpuNodeConfig> = Api::all(client);
    let mut history = History::new(settings.window);
    let mut ticks = tokio::time::interval(settings.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let nodes: Vec<GpuNode> = gpu_nodes.state().iter().map(|n| (**n).clone()).collect();
        let mut uses = HashMap::new();
        for node in &nodes {
            let name = node.name_any();
            let Some(endpoint) = projection.agent_endpoint(&name) else {
                continue;
            };
            match scrape(&endpoint).await {
                Ok(text) => {
                    uses.insert(name, usage::parse(&text));
                }
                Err(error) => {
                    tracing::debug!(node = %name, %endpoint, %error, "reading the agent's metrics for tuning advice failed");
                }
            }
        }
        let now = Timestamp::now();
        history.record(now, uses);
        let configs_now: Vec<GpuNodeConfig> =
            configs.state().iter().map(|c| (**c).clone()).collect();
        let placed = projection.placed_pods();
        let waits = projection.waiting().at(now, |uid| placed.contains(uid));
        let advice = evaluate(
            &history,
            pools(&configs_now, &nodes),
            &waits,
            &settings.thresholds,
            now,
        );
        // A pool not seen long enough has nothing to say yet: writing that
        // would hold its first real advice back by the write gap.
        let ready = |p: &&PoolAdvice| {
            p.pool.config.is_some() && p.observed.span >= settings.thresholds.min_span
        };
        for pool in advice.iter().filter(ready) {
            let name = &pool.pool.name;
            let new = status(pool, settings.window, now);
            let old = configs_now
                .iter()
                .find(|c| &c.name_any() == name)
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.tuning.as_ref());
            if !due(old, &new, now, settings.write_gap) {
                continue;
            }
            // Replaced whole (a merge patch would keep numbers the new
            // advice no longer has); the configs controller has written
            // the status by the time the config has matched nodes.
            let patch: json_patch::Patch = match serde_json::from_value(
                json!([{"op": "add", "path": "/status/tuning", "value": new}]),
            ) {
                Ok(patch) => patch,
                Err(error) => {
                    tracing::warn!(config = %name, %error, "encoding tuning advice failed");
                    continue;
                }
            };
            let params = PatchParams {
                field_manager: Some(MANAGER.to_owned()),
                ..PatchParams::default()
            };
            match api
                .patch_status(name, &params, &Patch::<()>::Json(patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(config = %name, advice = new.advice.len(), "tuning advice written")
                }
                Err(error) => {
                    tracing::warn!(config = %name, %error, "writing tuning advice failed")
                }
            }
        }
        projection.set_tuning(advice);
    }
}

#[cfg(test)]
mod tests;
