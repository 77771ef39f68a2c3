//! The node agents' liveness Leases (`tessera-agent-<node>`, renewed every
//! 10 s for 40 s), as last seen by a watch of their namespace, so the metrics
//! can say how long ago each agent last renewed. A GpuNode says what its
//! agent last wrote; only the Lease shows that the agent is still running.
//!
//! The API server cannot select Leases by name prefix, so the watch sees the
//! whole namespace (with `kube-node-lease`, the kubelets' Leases too) and
//! this table keeps only the agents'.

use std::{collections::BTreeMap, sync::Mutex};

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::ResourceExt;

/// The prefix of an agent Lease's name; the rest is the node's name.
pub const AGENT_LEASE_PREFIX: &str = "tessera-agent-";

/// The node whose agent holds the Lease named `lease`, if it is an agent's.
pub fn agent_node(lease: &str) -> Option<&str> {
    lease
        .strip_prefix(AGENT_LEASE_PREFIX)
        .filter(|node| !node.is_empty())
}

/// What an agent Lease says about its agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentLease {
    /// When the agent last renewed it (`spec.renewTime`, else `acquireTime`).
    pub renewed: Option<Timestamp>,
    /// How long it counts as held without renewal (`leaseDurationSeconds`).
    pub duration_seconds: Option<i32>,
}

impl AgentLease {
    /// The agent's view of a Lease object.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            renewed: spec
                .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
                .map(|t| t.0),
            duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        }
    }
}

/// Every agent Lease by node name.
#[derive(Debug, Default)]
pub struct AgentLeases {
    leases: Mutex<BTreeMap<String, AgentLease>>,
}

impl AgentLeases {
    fn leases(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AgentLease>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a Lease that exists; ignores those that are not an agent's.
    pub fn record(&self, lease: &Lease) {
        if let Some(node) = agent_node(&lease.name_any()) {
            self.leases().insert(node.to_owned(), AgentLease::of(lease));
        }
    }

    /// Forgets a deleted Lease.
    pub fn forget(&self, lease: &Lease) {
        if let Some(node) = agent_node(&lease.name_any()) {
            self.leases().remove(node);
        }
    }

    /// Replaces every Lease after a relist.
    pub fn replace<'a>(&self, leases: impl IntoIterator<Item = &'a Lease>) {
        *self.leases() = leases
            .into_iter()
            .filter_map(|l| Some((agent_node(&l.name_any())?.to_owned(), AgentLease::of(l))))
            .collect();
    }

    /// Every agent Lease, by node name.
    pub fn snapshot(&self) -> BTreeMap<String, AgentLease> {
        self.leases().clone()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lease(name: &str, renewed: &str) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "x", "leaseDurationSeconds": 40, "renewTime": renewed},
        }))
        .unwrap()
    }

    #[test]
    fn only_agent_leases_are_kept_by_node() {
        assert_eq!(agent_node("tessera-agent-gpu-1"), Some("gpu-1"));
        assert_eq!(agent_node("tessera-agent-"), None);
        assert_eq!(agent_node("gpu-1"), None, "the kubelet's own Lease");

        let table = AgentLeases::default();
        table.record(&lease("gpu-1", "2026-01-01T00:00:00.000000Z"));
        table.record(&lease("tessera-agent-gpu-1", "2026-01-01T00:00:10.000000Z"));
        let expected = AgentLease {
            renewed: Some("2026-01-01T00:00:10Z".parse().unwrap()),
            duration_seconds: Some(40),
        };
        assert_eq!(
            table.snapshot().into_iter().collect::<Vec<_>>(),
            vec![("gpu-1".to_owned(), expected)]
        );

        let relisted = [
            lease("tessera-agent-gpu-2", "2026-01-01T00:00:20.000000Z"),
            lease("gpu-2", "2026-01-01T00:00:20.000000Z"),
        ];
        table.replace(&relisted);
        assert_eq!(
            table.snapshot().keys().collect::<Vec<_>>(),
            ["gpu-2"],
            "a relist drops what it no longer lists"
        );
        table.forget(&relisted[0]);
        assert!(table.snapshot().is_empty());
    }

    #[test]
    fn a_lease_without_a_renewal_counts_from_its_acquisition() {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": "tessera-agent-n"},
            "spec": {"acquireTime": "2026-01-01T00:00:05.000000Z"},
        }))
        .unwrap();
        assert_eq!(
            AgentLease::of(&lease),
            AgentLease {
                renewed: Some("2026-01-01T00:00:05Z".parse().unwrap()),
                duration_seconds: None
            }
        );
    }
}
