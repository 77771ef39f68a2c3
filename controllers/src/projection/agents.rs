//! The node agents' DaemonSet pods, as the kubelets report them: the fast
//! path of noticing a dead agent. When an agent's container dies (SIGKILL,
//! crash, OOM kill) its kubelet sees it at its next PLEG relist (about 1 s)
//! and reports the pod not Ready with the container terminated or waiting;
//! the GpuNode still says what the dead agent last wrote. Pure: the watch in
//! [`super::Feeder`] feeds it.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::ResourceExt;

/// Why an agent pod cannot serve its node now, or `None` when it can: it is
/// Running, Ready, every container running, and not being deleted.
pub fn agent_pod_down(pod: &Pod) -> Option<String> {
    let name = pod.name_any();
    if pod.metadata.deletion_timestamp.is_some() {
        return Some(format!("node agent pod {name} is being deleted"));
    }
    let Some(status) = pod.status.as_ref() else {
        return Some(format!("node agent pod {name} has no status yet"));
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    if phase != "Running" {
        return Some(format!("node agent pod {name} is {phase}"));
    }
    for container in status.container_statuses.iter().flatten() {
        let state = container.state.as_ref();
        if state.is_some_and(|s| s.running.is_some()) {
            continue;
        }
        let why = state
            .and_then(|s| {
                s.terminated
                    .as_ref()
                    .map(|t| {
                        format!(
                            "terminated ({})",
                            t.reason.as_deref().unwrap_or("no reason")
                        )
                    })
                    .or_else(|| {
                        s.waiting.as_ref().map(|w| {
                            format!("waiting ({})", w.reason.as_deref().unwrap_or("no reason"))
                        })
                    })
            })
            .unwrap_or_else(|| "not running".to_owned());
        return Some(format!(
            "node agent pod {name}: container {} is {why}",
            container.name
        ));
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready");
    match ready {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!(
            "node agent pod {name} is not Ready ({})",
            c.reason.as_deref().unwrap_or("no reason")
        )),
        None => Some(format!("node agent pod {name} reports no Ready condition")),
    }
}

/// When the pod's containers last started (the latest `running.startedAt`),
/// by the kubelet's clock.
pub fn agent_pod_started(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| Some(c.state.as_ref()?.running.as_ref()?.started_at.as_ref()?.0))
        .max()
}

/// Where an agent pod answers `/readyz`: its IP and the port its
/// containers name [`PROBE_PORT_NAME`].
pub fn agent_pod_endpoint(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.as_ref()?;
    let port = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(PROBE_PORT_NAME))?
        .container_port;
    Some(if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    })
}

/// The name of the agent container's port that serves `/readyz` (the
/// chart's `http-metrics`).
pub const PROBE_PORT_NAME: &str = "http-metrics";

/// One agent pod: its node, why it is down, when its containers started,
/// where it answers `/readyz`.
#[derive(Debug)]
struct Seen {
    node: String,
    down: Option<String>,
    started: Option<Timestamp>,
    endpoint: Option<String>,
}

/// Every agent pod bound to a node, by pod UID, with its verdict.
#[derive(Debug, Default)]
pub struct AgentPods {
    pods: BTreeMap<String, Seen>,
}

impl AgentPods {
    /// Records a pod; returns its node (`None` while it is not bound).
    pub fn record(&mut self, pod: &Pod) -> Option<String> {
        let node = pod.spec.as_ref()?.node_name.clone()?;
        let uid = pod.metadata.uid.clone().unwrap_or_else(|| pod.name_any());
        let seen = Seen {
            node: node.clone(),
            down: agent_pod_down(pod),
            started: agent_pod_started(pod),
            endpoint: agent_pod_endpoint(pod),
        };
        self.pods.insert(uid, seen);
        Some(node)
    }

    /// Forgets a deleted pod; returns its node.
    pub fn forget(&mut self, pod: &Pod) -> Option<String> {
        let uid = pod.metadata.uid.clone().unwrap_or_else(|| pod.name_any());
        self.pods.remove(&uid).map(|seen| seen.node)
    }

    /// Forgets every pod (a relist follows).
    pub fn clear(&mut self) {
        self.pods.clear();
    }

    /// Why `node`'s agent is down: every agent pod on it is down (during a
    /// rollout the old and the new pod overlap; one serving is enough).
    /// `None` when one is up, or when no agent pod is known there (agents
    /// not run as pods of the watched DaemonSet: no opinion).
    pub fn down(&self, node: &str) -> Option<String> {
        let mut reasons = self
            .pods
            .values()
            .filter(|s| s.node == node)
            .map(|s| &s.down);
        let first = reasons.next()?.clone()?;
        reasons.all(Option::is_some).then_some(first)
    }

    /// When the containers of `node`'s serving agent pod started (the
    /// latest among serving pods); `None` when none serves.
    pub fn started(&self, node: &str) -> Option<Timestamp> {
        self.pods
            .values()
            .filter(|s| s.node == node && s.down.is_none())
            .filter_map(|s| s.started)
            .max()
    }

    /// Where `node`'s serving agent pod answers `/readyz`, if one serves
    /// and says where.
    pub fn endpoint(&self, node: &str) -> Option<String> {
        self.pods
            .values()
            .filter(|s| s.node == node && s.down.is_none())
            .find_map(|s| s.endpoint.clone())
    }

    /// Every node with an agent pod: why it is down and when it started.
    pub fn all(&self) -> Vec<(String, Option<String>, Option<Timestamp>)> {
        let mut nodes: Vec<&String> = self.pods.values().map(|s| &s.node).collect();
        nodes.sort();
        nodes.dedup();
        nodes
            .into_iter()
            .map(|n| (n.clone(), self.down(n), self.started(n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(uid: &str, node: Option<&str>, status: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("agent-{uid}"), "namespace": "tessera-system", "uid": uid},
            "spec": {"nodeName": node, "containers": [{"name": "node-agent"}]},
            "status": status,
        }))
        .unwrap()
    }

    fn running(ready: bool) -> Value {
        json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "node-agent", "ready": ready, "restartCount": 0, "image": "i", "imageID": "",
                                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
        })
    }

    fn killed() -> Value {
        json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "node-agent", "ready": false, "restartCount": 1, "image": "i", "imageID": "",
                                   "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}],
        })
    }

    #[test]
    fn a_serving_agent_pod_is_probed_at_its_ip_and_metrics_port() {
        let mut serving = pod("1", Some("n1"), running(true));
        let mut status = running(true);
        status["podIP"] = json!("10.0.0.5");
        serving.status = serde_json::from_value(status).unwrap();
        assert_eq!(agent_pod_endpoint(&serving), None, "no named port");
        serving.spec.as_mut().unwrap().containers[0].ports = Some(
            serde_json::from_value(json!([
                {"name": "other", "containerPort": 1},
                {"name": "http-metrics", "containerPort": 9394},
            ]))
            .unwrap(),
        );
        assert_eq!(
            agent_pod_endpoint(&serving).as_deref(),
            Some("10.0.0.5:9394")
        );
        let mut pods = AgentPods::default();
        pods.record(&serving);
        assert_eq!(pods.endpoint("n1").as_deref(), Some("10.0.0.5:9394"));
        assert_eq!(pods.endpoint("n2"), None);
        // A pod that is down is not asked.
        let mut dead = serving.clone();
        dead.status = serde_json::from_value(killed()).unwrap();
        pods.record(&dead);
        assert_eq!(pods.endpoint("n1"), None);
    }

    #[test]
    fn an_agent_pod_serves_only_while_running_and_ready() {
        assert_eq!(agent_pod_down(&pod("1", Some("n1"), running(true))), None);
        assert_eq!(
            agent_pod_down(&pod("1", Some("n1"), killed())).as_deref(),
            Some("node agent pod agent-1: container node-agent is terminated (Error)")
        );
        let mut crashlooping = killed();
        crashlooping["containerStatuses"][0]["state"] =
            json!({"waiting": {"reason": "CrashLoopBackOff"}});
        assert_eq!(
            agent_pod_down(&pod("1", Some("n1"), crashlooping)).as_deref(),
            Some("node agent pod agent-1: container node-agent is waiting (CrashLoopBackOff)")
        );
        assert_eq!(
            agent_pod_down(&pod("1", Some("n1"), running(false))).as_deref(),
            Some("node agent pod agent-1 is not Ready (ContainersNotReady)")
        );
        assert_eq!(
            agent_pod_down(&pod("1", Some("n1"), json!({"phase": "Pending"}))).as_deref(),
            Some("node agent pod agent-1 is Pending")
        );
        let mut deleting = pod("1", Some("n1"), running(true));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(agent_pod_down(&deleting).is_some_and(|r| r.contains("being deleted")));
    }

    #[test]
    fn a_node_is_down_only_while_every_agent_pod_on_it_is() {
        let mut pods = AgentPods::default();
        assert_eq!(
            pods.record(&pod("u0", None, json!({}))),
            None,
            "not bound yet"
        );
        assert_eq!(pods.down("n1"), None, "no agent pod known: no opinion");
        pods.record(&pod("old", Some("n1"), killed()));
        assert!(pods.down("n1").is_some());
        pods.record(&pod("new", Some("n1"), running(true)));
        assert_eq!(pods.down("n1"), None, "the new pod of a rollout serves");
        pods.record(&pod("new", Some("n1"), running(false)));
        assert_eq!(
            pods.all(),
            [(
                "n1".to_owned(),
                Some("node agent pod agent-new is not Ready (ContainersNotReady)".to_owned()),
                None
            )]
        );
        assert_eq!(
            pods.forget(&pod("old", Some("n1"), json!({}))).as_deref(),
            Some("n1")
        );
        assert!(pods.down("n1").is_some_and(|r| r.contains("agent-new")));
        pods.record(&pod("new", Some("n1"), running(true)));
        assert_eq!(
            pods.started("n1"),
            Some("2026-01-01T00:00:00Z".parse().unwrap()),
            "the serving container's start"
        );
        pods.clear();
        assert!(pods.all().is_empty());
    }
}
