//! Who waits for capacity: the nodes GPU pods were turned away from since
//! capacity last appeared on them. The extender records them at Filter and
//! tells kube-scheduler when the projection reports capacity on one
//! (`extender::nudge`, which says why kube-scheduler needs telling).

use std::{collections::BTreeSet, sync::Mutex};
/// Nodes a GPU pod was turned away from since they were last nudged.
#[derive(Debug, Default)]
pub struct Waiters {
    nodes: Mutex<BTreeSet<String>>,
}

impl Waiters {
    fn nodes(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that pods were turned away from `nodes`. Filter calls this
    /// while it still holds the ledger's read lock, so a change applied
    /// after its decision finds the record.
    pub fn record<'a>(&self, nodes: impl IntoIterator<Item = &'a str>) {
        let mut waiting = self.nodes();
        for node in nodes {
            if !waiting.contains(node) {
                waiting.insert(node.to_owned());
            }
        }
    }

    /// Whether pods were waiting for `node`; forgets them.
    pub fn take(&self, node: &str) -> bool {
        self.nodes().remove(node)
    }

    /// Every node pods were waiting for; forgets them.
    pub fn take_all(&self) -> Vec<String> {
        std::mem::take(&mut *self.nodes()).into_iter().collect()
    }

    /// Whether pods wait for `node` (for tests and metrics).
    pub fn contains(&self, node: &str) -> bool {
        self.nodes().contains(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_of_rejections_is_nudged_once() {
        let waiters = Waiters::default();
        assert!(!waiters.take("n1"), "nobody waits: no write");
        waiters.record(["n1", "n2", "n1"]);
        assert!(waiters.contains("n1"));
        assert!(waiters.take("n1"));
        assert!(!waiters.take("n1"), "once per round");
        waiters.record(["n3"]);
        assert_eq!(waiters.take_all(), ["n2", "n3"]);
        assert!(waiters.take_all().is_empty());
    }
}
