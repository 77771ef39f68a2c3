//! GPU pods waiting for a GPU: those Filter found no node for, since the
//! first such answer. kube-scheduler asks Filter again for an unschedulable
//! pod at least every 5 minutes (`podMaxInUnschedulablePodsDuration`) and
//! whenever the cluster changes, so a pod Filter has not asked about for
//! [`FORGET_AFTER`] is gone (deleted, or placed through another replica) and
//! is forgotten; a pod with an allocation is placed and is not waiting,
//! whichever replica placed it. This is the tuning guide's "pods waiting
//! for GPUs" (性能调优指南 §5.2) and its Pending alert (§5.4) asked of
//! Tessera's own series: `tessera_gpu_pod_waiting_seconds`.

use std::{collections::HashMap, sync::Mutex};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::engine::Lack;

/// The most nodes remembered per waiting pod.
pub const MAX_NODES: usize = 256;

/// How long a pod Filter no longer asks about is remembered.
pub const FORGET_AFTER: SignedDuration = SignedDuration::from_secs(10 * 60);

/// One waiting pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Filter's first answer without a node.
    pub since: Timestamp,
    /// What the rejecting nodes lacked most at Filter's last answer;
    /// `None` when it was something else (a type, a quota, a node not
    /// ready).
    pub lack: Option<Lack>,
    /// The nodes that lacked slices, memory or cores at Filter's last
    /// answer, and which (at most [`MAX_NODES`]): the tuning advice counts
    /// the pod against those nodes.
    pub lacking: Vec<(String, Lack)>,
    /// Filter's last answer without a node.
    seen: Timestamp,
}

/// The waiting pods, by UID.
#[derive(Debug, Default)]
pub struct Waiting {
    pods: Mutex<HashMap<String, Wait>>,
}

impl Waiting {
    fn pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, Wait>> {
        // A panic elsewhere while holding the lock leaves plain records.
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Filter found no node for pod `uid` at `now`, `lacking` saying which
    /// nodes lacked slices, memory or cores; the pod's lack is the one most
    /// of them had (ties: slice, memory, cores).
    pub fn unfit(
        &self,
        uid: &str,
        namespace: &str,
        name: &str,
        mut lacking: Vec<(String, Lack)>,
        now: Timestamp,
    ) {
        let mut counts = std::collections::BTreeMap::<Lack, usize>::new();
        for (_, lack) in &lacking {
            *counts.entry(*lack).or_default() += 1;
        }
        let lack = counts
            .iter()
            .rev()
            .max_by_key(|&(_, n)| *n)
            .map(|(&lack, _)| lack);
        lacking.truncate(MAX_NODES);
        let mut pods = self.pods();
        let wait = pods.entry(uid.to_owned()).or_insert_with(|| Wait {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            since: now,
            lack,
            lacking: Vec::new(),
            seen: now,
        });
        wait.seen = now;
        wait.lack = lack;
        wait.lacking = lacking;
    }

    /// Filter found a node for pod `uid`: it waits no longer.
    pub fn fit(&self, uid: &str) {
        self.pods().remove(uid);
    }

    /// The pods waiting at `now`, by UID, leaving out those `placed` says
    /// have an allocation; forgets those Filter has not asked about for
    /// [`FORGET_AFTER`] and those placed.
    pub fn at(&self, now: Timestamp, placed: impl Fn(&str) -> bool) -> Vec<Wait> {
        let mut pods = self.pods();
        pods.retain(|uid, wait| now.duration_since(wait.seen) < FORGET_AFTER && !placed(uid));
        let mut waits: Vec<Wait> = pods.values().cloned().collect();
        waits.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        waits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn names(waits: &[Wait]) -> Vec<(&str, Timestamp)> {
        waits.iter().map(|w| (w.name.as_str(), w.since)).collect()
    }

    #[test]
    fn a_pod_waits_from_its_first_unfit_answer_until_it_fits() {
        let waiting = Waiting::default();
        waiting.unfit("u1", "ml", "a", vec![], t(0));
        waiting.unfit("u1", "ml", "a", vec![], t(300));
        waiting.unfit("u2", "ml", "b", vec![("n1".into(), Lack::Slice)], t(10));
        assert_eq!(
            names(&waiting.at(t(400), |_| false)),
            [("a", t(0)), ("b", t(10))]
        );
        waiting.fit("u1");
        assert_eq!(names(&waiting.at(t(400), |_| false)), [("b", t(10))]);
        // Unfit again later: a new wait.
        waiting.unfit("u1", "ml", "a", vec![], t(500));
        assert_eq!(names(&waiting.at(t(500), |_| false))[0], ("a", t(500)));
    }

    #[test]
    fn a_pods_lack_is_what_most_nodes_lacked() {
        let waiting = Waiting::default();
        let nodes = |lacks: &[Lack]| -> Vec<(String, Lack)> {
            lacks
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("n{i}"), *l))
                .collect()
        };
        waiting.unfit(
            "u",
            "ml",
            "a",
            nodes(&[Lack::Cores, Lack::Memory, Lack::Memory]),
            t(0),
        );
        assert_eq!(waiting.at(t(0), |_| false)[0].lack, Some(Lack::Memory));
        // A tie goes to the slice, then memory.
        waiting.unfit("u", "ml", "a", nodes(&[Lack::Cores, Lack::Slice]), t(1));
        let wait = &waiting.at(t(1), |_| false)[0];
        assert_eq!(wait.lack, Some(Lack::Slice));
        assert_eq!(wait.lacking.len(), 2);
        waiting.unfit("u", "ml", "a", vec![], t(2));
        assert_eq!(waiting.at(t(2), |_| false)[0].lack, None);
        let many = nodes(&[Lack::Memory; MAX_NODES + 10]);
        waiting.unfit("u", "ml", "a", many, t(3));
        assert_eq!(waiting.at(t(3), |_| false)[0].lacking.len(), MAX_NODES);
    }

    #[test]
    fn placed_pods_and_pods_filter_forgot_are_not_waiting() {
        let waiting = Waiting::default();
        waiting.unfit("u1", "ml", "a", vec![], t(0));
        waiting.unfit("u2", "ml", "b", vec![("n1".into(), Lack::Slice)], t(0));
        waiting.unfit("u3", "ml", "c", vec![("n1".into(), Lack::Memory)], t(0));
        waiting.unfit("u3", "ml", "c", vec![("n1".into(), Lack::Memory)], t(400));
        // b was placed through another replica; a was not asked about for
        // 10 minutes (deleted); c was asked about 4 minutes ago.
        let waits = waiting.at(t(600), |uid| uid == "u2");
        assert_eq!(names(&waits), [("c", t(0))]);
        // Forgotten for good: b's allocation going away does not bring it back.
        assert_eq!(names(&waiting.at(t(601), |_| false)), [("c", t(0))]);
    }
}
