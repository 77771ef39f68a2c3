//! HAMi's tuning guide's decision tree (性能调优指南 §5.2), over what a pool of
//! GPU nodes (one GpuNodeConfig's, or one node without a config) was seen
//! doing. Pure: the numbers come in, advice with its evidence comes out; no
//! spec is ever changed from here (GitOps owns the spec).
//!
//! The tree, as the guide draws it:
//! - memory use persistently under 50 % of the limits: raise
//!   `deviceMemoryScaling` (or lower the pods' requests); otherwise keep it,
//!   or lower it where use runs near the limits on an oversubscribed pool;
//! - compute use persistently under its limits: lower `gpucores` (or set
//!   `gpuCorePolicy: disable`);
//! - pods waiting for GPUs: raise `deviceSplitCount` when they lacked a free
//!   slice, add GPU nodes when they lacked memory or cores.
//!
//! "Persistently" is the 95th percentile over the observation window: memory
//! use whose p95 is under half the limits stayed there 95 % of the time.
//! Nothing is advised before the pool was seen for [`Thresholds::min_span`].

use std::time::Duration;

use tessera_api::v1alpha1::CorePolicy;

/// What a pool was seen doing over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// How long the observations cover.
    pub span: Duration,
    /// GPUs in the pool.
    pub gpus: u32,
    /// The 95th percentile, over the window, of the pool's memory use: the
    /// memory its containers held over their limits, percent. `None` when
    /// no container held a limit.
    pub memory_p95: Option<f64>,
    /// The 95th percentile of its compute use over its compute limits,
    /// percent, over the containers whose compute is measured. `None` when
    /// none is.
    pub compute_p95: Option<f64>,
    /// Pods that waited for a GPU longer than [`Thresholds::wait`], by what
    /// they lacked.
    pub waited: Waited,
}

/// Pods that waited for a GPU, by what they lacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waited {
    /// A free slice (every GPU held its split count of pods).
    pub slices: WaitCount,
    /// Device memory.
    pub memory: WaitCount,
    /// Cores.
    pub cores: WaitCount,
}

/// How many pods waited, and the longest wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCount {
    /// Pods.
    pub pods: u32,
    /// The longest wait.
    pub longest: Duration,
}

/// The pool's settings the advice is about.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Current {
    /// `deviceMemoryScaling`.
    pub memory_scaling: f64,
    /// `deviceSplitCount`.
    pub split_count: u32,
    /// `gpuCorePolicy`.
    pub core_policy: CorePolicy,
}

/// Where the tree's branches are cut.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// No advice on less than this much observation.
    pub min_span: Duration,
    /// Memory use (p95, percent) under which scaling may rise.
    pub memory_low: f64,
    /// Memory use (p95, percent) over which an oversubscribed pool should
    /// scale down.
    pub memory_high: f64,
    /// The memory use (percent of physical memory) a raised or lowered
    /// scaling aims at.
    pub memory_target: f64,
    /// Compute use (p95, percent of limits) under which limits may fall.
    pub compute_low: f64,
    /// Pods waiting longer than this count.
    pub wait: Duration,
}

impl Default for Thresholds {
    /// The guide's cuts: memory under 50 %, compute under its limits (half
    /// of them: a limit a container never nears is one to lower), OOM risk
    /// over 90 % (§5.3); a pod waiting over 10 minutes (§5.4's Pending
    /// alert); an hour of observation before any advice, and a raised
    /// scaling aiming at 60 % of physical memory, leaving room for peaks.
    fn default() -> Self {
        Self {
            min_span: Duration::from_secs(3600),
            memory_low: 50.0,
            memory_high: 90.0,
            memory_target: 60.0,
            compute_low: 50.0,
            wait: Duration::from_secs(600),
        }
    }
}

/// One piece of advice.
#[derive(Clone, Debug, PartialEq)]
pub enum Advice {
    /// Memory use stays low: hand out more memory than the GPUs have (or
    /// lower the pods' requests).
    RaiseMemoryScaling {
        /// The current scaling.
        from: f64,
        /// The advised scaling.
        to: f64,
    },
    /// Memory use runs near the limits on an oversubscribed pool: hand out
    /// less.
    LowerMemoryScaling {
        /// The current scaling.
        from: f64,
        /// The advised scaling.
        to: f64,
    },
    /// Compute use stays well under its limits: lower the pods' `gpucores`,
    /// or stop limiting (`gpuCorePolicy: disable`).
    LowerCoreLimits,
    /// Pods waited for a free slice: allow more pods per GPU.
    RaiseSplitCount {
        /// The current split count.
        from: u32,
        /// The advised split count.
        to: u32,
    },
    /// Pods waited for memory or cores no GPU had free: add GPU nodes.
    AddGpuNodes,
}

/// The guide's tree over `observed`, for a pool set as `current`.
pub fn advise(observed: &Observed, current: &Current, cut: &Thresholds) -> Vec<Advice> {
    let mut advice = Vec::new();
    if observed.span < cut.min_span {
        return advice;
    }
    let scaling = current.memory_scaling;
    if let Some(p95) = observed.memory_p95 {
        // With the pool's memory handed out at scaling s, containers using
        // p95 % of their limits use p95 × s % of the GPUs' memory: the
        // scaling that puts that at the target.
        let aimed = round_down(cut.memory_target / p95.max(1.0));
        if p95 < cut.memory_low {
            // At most double per step: the next window shows how it went.
            let to = aimed.min(round_down(scaling * 2.0));
            if to > scaling {
                advice.push(Advice::RaiseMemoryScaling { from: scaling, to });
            }
        } else if p95 > cut.memory_high && scaling > 1.0 {
            let to = aimed.max(1.0);
            if to < scaling {
                advice.push(Advice::LowerMemoryScaling { from: scaling, to });
            }
        }
    }
    if current.core_policy != CorePolicy::Disable
        && observed
            .compute_p95
            .is_some_and(|p95| p95 < cut.compute_low)
    {
        advice.push(Advice::LowerCoreLimits);
    }
    let waited = &observed.waited;
    if waited.slices.pods > 0 {
        // Room for every pod that waited, spread over the pool's GPUs.
        let more = waited.slices.pods.div_ceil(observed.gpus.max(1));
        advice.push(Advice::RaiseSplitCount {
            from: current.split_count,
            to: current.split_count + more,
        });
    }
    if waited.memory.pods > 0 || waited.cores.pods > 0 {
        advice.push(Advice::AddGpuNodes);
    }
    advice
}

/// `value` rounded down to a tenth (scalings are written with one decimal).
fn round_down(value: f64) -> f64 {
    (value * 10.0 + 1e-9).floor() / 10.0
}

/// The 95th percentile of `values` (nearest rank); `None` when empty.
pub fn p95(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = (values.len() * 95).div_ceil(100).max(1);
    values.get(rank - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn current(scaling: f64) -> Current {
        Current {
            memory_scaling: scaling,
            split_count: 10,
            core_policy: CorePolicy::Default,
        }
    }

    fn seen(memory: Option<f64>, compute: Option<f64>) -> Observed {
        Observed {
            span: 6 * HOUR,
            gpus: 16,
            memory_p95: memory,
            compute_p95: compute,
            waited: Waited::default(),
        }
    }

    fn advise_default(observed: &Observed, current: &Current) -> Vec<Advice> {
        advise(observed, current, &Thresholds::default())
    }

    #[test]
    fn memory_under_half_the_limits_raises_the_scaling_toward_sixty_percent() {
        // 31 % of limits at 1.0: 60 / 31 = 1.93.
        assert_eq!(
            advise_default(&seen(Some(31.0), None), &current(1.0)),
            [Advice::RaiseMemoryScaling { from: 1.0, to: 1.9 }]
        );
        // 49.9 %: still under; 50 %: not.
        assert_eq!(
            advise_default(&seen(Some(49.9), None), &current(1.0)),
            [Advice::RaiseMemoryScaling { from: 1.0, to: 1.2 }]
        );
        assert!(advise_default(&seen(Some(50.0), None), &current(1.0)).is_empty());
        // Nearly idle: at most double per step.
        assert_eq!(
            advise_default(&seen(Some(2.0), None), &current(1.5)),
            [Advice::RaiseMemoryScaling { from: 1.5, to: 3.0 }]
        );
        // Already scaled to what the use allows: nothing to raise.
        assert!(advise_default(&seen(Some(49.0), None), &current(1.2)).is_empty());
    }

    #[test]
    fn memory_near_the_limits_lowers_only_an_oversubscribed_scaling() {
        assert_eq!(
            advise_default(&seen(Some(95.0), None), &current(2.0)),
            [Advice::LowerMemoryScaling { from: 2.0, to: 1.0 }]
        );
        // Never below 1.
        assert_eq!(
            advise_default(&seen(Some(100.0), None), &current(1.5)),
            [Advice::LowerMemoryScaling { from: 1.5, to: 1.0 }]
        );
        // 90 % is not over 90 %; at 1.0 there is nothing to take back.
        assert!(advise_default(&seen(Some(90.0), None), &current(2.0)).is_empty());
        assert!(advise_default(&seen(Some(99.0), None), &current(1.0)).is_empty());
    }

    #[test]
    fn compute_well_under_its_limits_lowers_them_unless_they_are_off() {
        assert_eq!(
            advise_default(&seen(None, Some(49.0)), &current(1.0)),
            [Advice::LowerCoreLimits]
        );
        assert!(advise_default(&seen(None, Some(50.0)), &current(1.0)).is_empty());
        let off = Current {
            core_policy: CorePolicy::Disable,
            ..current(1.0)
        };
        assert!(advise_default(&seen(None, Some(10.0)), &off).is_empty());
    }

    #[test]
    fn pods_that_waited_raise_the_split_count_or_ask_for_nodes() {
        let mut observed = seen(Some(70.0), Some(80.0));
        observed.waited.slices = WaitCount {
            pods: 17,
            longest: HOUR,
        };
        // 17 pods over 16 GPUs: two more slices per GPU.
        assert_eq!(
            advise_default(&observed, &current(1.0)),
            [Advice::RaiseSplitCount { from: 10, to: 12 }]
        );
        observed.waited.slices = WaitCount::default();
        observed.waited.cores.pods = 1;
        assert_eq!(
            advise_default(&observed, &current(1.0)),
            [Advice::AddGpuNodes]
        );
    }

    #[test]
    fn nothing_is_advised_on_too_short_a_look() {
        let mut observed = seen(Some(5.0), Some(5.0));
        observed.waited.memory.pods = 3;
        observed.span = HOUR - Duration::from_secs(1);
        assert!(advise_default(&observed, &current(1.0)).is_empty());
        observed.span = HOUR;
        assert_eq!(advise_default(&observed, &current(1.0)).len(), 3);
    }

    #[test]
    fn the_95th_percentile_is_the_nearest_rank() {
        assert_eq!(p95([]), None);
        assert_eq!(p95([7.0]), Some(7.0));
        let hundred = (1..=100).map(f64::from);
        assert_eq!(p95(hundred), Some(95.0));
        // 20 values: rank 19.
        assert_eq!(p95((1..=20).map(f64::from)), Some(19.0));
        assert_eq!(p95([f64::NAN, 3.0]), Some(3.0));
    }
}
