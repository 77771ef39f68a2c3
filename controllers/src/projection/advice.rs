//! The pools' tuning advice as the leader last computed it (the tuning
//! module computes it; the metrics read it here, in the projection every
//! replica has).

use std::collections::BTreeSet;

use crate::engine::tuning::{Advice, Current, Observed};

/// A pool of GPU nodes the advice is about.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// The GpuNodeConfig that selects the nodes; `None` for a node no
    /// config selects.
    pub config: Option<String>,
    /// The config's name, or `node/<name>`.
    pub name: String,
    /// Its nodes.
    pub nodes: BTreeSet<String>,
    /// GPUs on those nodes.
    pub gpus: u32,
    /// The settings the nodes run with (the first node's).
    pub current: Current,
}

/// A pool's advice and the evidence behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAdvice {
    /// The pool.
    pub pool: Pool,
    /// What it was seen doing.
    pub observed: Observed,
    /// The guide's advice.
    pub advice: Vec<Advice>,
}
