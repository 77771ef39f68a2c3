//! What the nodes were seen using over the window: one entry per scrape
//! round, per node, dropped once older than the window.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;

use super::usage::NodeUse;
use crate::engine::tuning::p95;

/// One node's use at one round, as four `f32`s (the history holds
/// nodes × rounds of them: 5,000 nodes over 72 rounds is 7 MB).
#[derive(Clone, Copy, Debug)]
struct Compact([f32; 4]);

impl Compact {
    fn of(use_: &NodeUse) -> Self {
        // Bytes and percent-points: f32's 24 bits of mantissa are plenty
        // for a percentile of ratios.
        Self([
            use_.memory_used as f32,
            use_.memory_limit as f32,
            use_.core_used as f32,
            use_.core_limit as f32,
        ])
    }

    fn node_use(self) -> NodeUse {
        let [memory_used, memory_limit, core_used, core_limit] = self.0.map(f64::from);
        NodeUse {
            memory_used,
            memory_limit,
            core_used,
            core_limit,
        }
    }
}

/// One scrape round: per node index, its use if it was read.
#[derive(Clone, Debug)]
struct Round {
    at: Timestamp,
    nodes: Vec<Option<Compact>>,
}

/// The scrape rounds within the window.
#[derive(Clone, Debug)]
pub struct History {
    window: Duration,
    /// Node names to their index in a round.
    index: HashMap<String, usize>,
    rounds: VecDeque<Round>,
}

/// What a pool was seen using.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Seen {
    /// From the first round that saw one of its nodes to the last round.
    pub span: Duration,
    /// The 95th percentile of the rounds' memory use over limits, percent.
    pub memory_p95: Option<f64>,
    /// The 95th percentile of the rounds' compute use over limits, percent.
    pub compute_p95: Option<f64>,
}

impl History {
    /// An empty history keeping `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            index: HashMap::new(),
            rounds: VecDeque::new(),
        }
    }

    /// The window kept.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Adds a round read at `at`, and drops the rounds older than the
    /// window (and the nodes no round kept has seen).
    pub fn record(&mut self, at: Timestamp, nodes: HashMap<String, NodeUse>) {
        let mut round = Round {
            at,
            nodes: vec![None; self.index.len()],
        };
        for (name, use_) in &nodes {
            let next = self.index.len();
            let i = *self.index.entry(name.clone()).or_insert(next);
            if i >= round.nodes.len() {
                round.nodes.resize(i + 1, None);
            }
            round.nodes[i] = Some(Compact::of(use_));
        }
        self.rounds.push_back(round);
        while let Some(first) = self.rounds.front() {
            if at.duration_since(first.at).unsigned_abs() <= self.window {
                break;
            }
            self.rounds.pop_front();
        }
        self.forget_unseen();
    }

    /// Drops nodes no kept round read (gone from the cluster), so the index
    /// does not grow for ever.
    fn forget_unseen(&mut self) {
        let seen = |i: usize| {
            self.rounds
                .iter()
                .any(|r| r.nodes.get(i).is_some_and(Option::is_some))
        };
        if self.index.values().all(|&i| seen(i)) {
            return;
        }
        let keep: Vec<(String, usize)> = self
            .index
            .iter()
            .filter(|&(_, &i)| seen(i))
            .map(|(name, &i)| (name.clone(), i))
            .collect();
        let mut index = HashMap::new();
        for round in &mut self.rounds {
            round.nodes = keep
                .iter()
                .map(|&(_, i)| round.nodes.get(i).copied().flatten())
                .collect();
        }
        for (new, (name, _)) in keep.into_iter().enumerate() {
            index.insert(name, new);
        }
        self.index = index;
    }

    /// What the nodes in `pool` were seen using, together, over the window.
    pub fn seen(&self, pool: &BTreeSet<String>) -> Seen {
        let indexes: Vec<usize> = pool
            .iter()
            .filter_map(|n| self.index.get(n).copied())
            .collect();
        let mut first = None;
        let mut memory = Vec::new();
        let mut compute = Vec::new();
        for round in &self.rounds {
            let mut total = NodeUse::default();
            let mut any = false;
            for use_ in indexes
                .iter()
                .filter_map(|&i| round.nodes.get(i).copied().flatten())
            {
                total.add(&use_.node_use());
                any = true;
            }
            if !any {
                continue;
            }
            first.get_or_insert(round.at);
            memory.extend(total.memory_percent());
            compute.extend(total.compute_percent());
        }
        let span = match (first, self.rounds.back()) {
            (Some(first), Some(last)) => last.at.duration_since(first).unsigned_abs(),
            _ => Duration::ZERO,
        };
        Seen {
            span,
            memory_p95: p95(memory),
            compute_p95: p95(compute),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(minutes: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + minutes * 60).unwrap()
    }

    fn use_(memory: f64, compute: Option<f64>) -> NodeUse {
        NodeUse {
            memory_used: memory,
            memory_limit: 100.0,
            core_used: compute.unwrap_or(0.0),
            core_limit: if compute.is_some() { 100.0 } else { 0.0 },
        }
    }

    fn pool(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_pool_is_its_nodes_summed_per_round_and_the_window_slides() {
        let mut history = History::new(Duration::from_secs(600));
        for minute in 0..=20 {
            // a holds 10 % then 90 % from minute 15; b always 50 %.
            let a = if minute < 15 { 10.0 } else { 90.0 };
            history.record(
                t(minute),
                [
                    ("a".to_owned(), use_(a, Some(20.0))),
                    ("b".to_owned(), use_(50.0, None)),
                ]
                .into(),
            );
        }
        // Minutes 10..=20 are kept: 11 rounds, 5 of a at 10 % and 6 at 90 %.
        let seen = history.seen(&pool(&["a"]));
        assert_eq!(seen.span, Duration::from_secs(600));
        assert_eq!(seen.memory_p95, Some(90.0));
        assert_eq!(seen.compute_p95, Some(20.0));
        // a and b together: (10 + 50) / 200 = 30 %, then (90 + 50) / 200 = 70 %.
        let both = history.seen(&pool(&["a", "b"]));
        assert_eq!(both.memory_p95, Some(70.0));
        // b is not measured for compute; a's 20 of 100 still is.
        assert_eq!(both.compute_p95, Some(20.0));
        // A pool nobody scraped.
        assert_eq!(history.seen(&pool(&["z"])), Seen::default());
    }

    #[test]
    fn nodes_no_kept_round_saw_are_forgotten() {
        let mut history = History::new(Duration::from_secs(120));
        history.record(t(0), [("gone".to_owned(), use_(10.0, None))].into());
        history.record(t(1), [("a".to_owned(), use_(20.0, None))].into());
        history.record(t(2), [("a".to_owned(), use_(30.0, None))].into());
        history.record(t(3), [("a".to_owned(), use_(40.0, None))].into());
        assert_eq!(history.index.len(), 1);
        assert_eq!(history.seen(&pool(&["gone"])), Seen::default());
        // Rounds 1..=3 kept, a's values intact after the reindexing.
        assert_eq!(history.seen(&pool(&["a"])).memory_p95, Some(40.0));
        assert_eq!(history.seen(&pool(&["a"])).span, Duration::from_secs(120));
    }

    #[test]
    fn a_node_seen_late_has_a_shorter_span() {
        let mut history = History::new(Duration::from_secs(3600));
        history.record(t(0), [("a".to_owned(), use_(10.0, None))].into());
        history.record(t(5), [("a".to_owned(), use_(10.0, None))].into());
        history.record(
            t(10),
            [
                ("a".to_owned(), use_(10.0, None)),
                ("b".to_owned(), use_(10.0, None)),
            ]
            .into(),
        );
        assert_eq!(history.seen(&pool(&["b"])).span, Duration::ZERO);
        assert_eq!(history.seen(&pool(&["a"])).span, Duration::from_secs(600));
        assert_eq!(history.seen(&pool(&["b"])).compute_p95, None);
    }
}
