//! kube-scheduler's extender v1 wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go structs have no JSON tags, so keys are the Go field names in
//! PascalCase, and `PodUID` is spelled exactly so. Tests pin the format.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

/// What Filter and Prioritize receive.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    pub pod: Pod,
    /// Candidate nodes as objects, when the extender is not node-cache capable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeItems>,
    /// Candidate node names, when the extender is node-cache capable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
}

/// A `NodeList`; nodes are kept as raw JSON so they round-trip untouched.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct NodeItems {
    /// List metadata.
    #[serde(default)]
    pub metadata: serde_json::Value,
    /// The nodes.
    #[serde(default)]
    pub items: Vec<serde_json::Value>,
}

impl ExtenderArgs {
    /// The candidate node names, from whichever form was sent.
    pub fn candidate_names(&self) -> Vec<&str> {
        if let Some(names) = &self.node_names {
            return names.iter().map(String::as_str).collect();
        }
        let items = self.nodes.iter().flat_map(|n| &n.items);
        items
            .filter_map(|n| n["metadata"]["name"].as_str())
            .collect()
    }
}

/// Filter's answer.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    /// Feasible nodes as objects (only when they were sent as objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeItems>,
    /// Feasible node names (node-cache capable form).
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
    /// Infeasible nodes and why; preemption might help.
    #[serde(default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Infeasible nodes and why; preemption cannot help.
    #[serde(default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Non-empty: the pod fails scheduling with this error.
    #[serde(default)]
    pub error: String,
}

/// One node's score from Prioritize; the answer is a bare JSON array of these.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    /// The node name.
    pub host: String,
    /// 0..=10 (`MaxExtenderPriority`).
    pub score: i64,
}

/// What Bind receives.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    /// The pod's name.
    pub pod_name: String,
    /// The pod's namespace.
    pub pod_namespace: String,
    /// The pod's UID.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// The chosen node.
    pub node: String,
}

/// Bind's answer; a non-empty error fails the binding and the pod is retried.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    /// Why binding failed, or empty.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    #[test]
    fn filter_args_as_kube_scheduler_sends_them() {
        // Node-cache capable: names only, Nodes null.
        let sent = json!({"Pod": {"metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": []}}, "Nodes": null, "NodeNames": ["n1", "n2"]});
        let args: ExtenderArgs = serde_json::from_value(sent).unwrap();
        assert_eq!(args.pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(args.candidate_names(), ["n1", "n2"]);
        // Not node-cache capable: full nodes.
        let sent = json!({"Pod": {"metadata": {"name": "p"}}, "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "n3"}, "status": {"capacity": {"cpu": "4"}}}]}, "NodeNames": null});
        let args: ExtenderArgs = serde_json::from_value(sent).unwrap();
        assert_eq!(args.candidate_names(), ["n3"]);
        assert_eq!(
            args.nodes.unwrap().items[0]["status"]["capacity"]["cpu"],
            "4",
            "nodes round-trip untouched"
        );
    }

    #[test]
    fn filter_result_keys_are_pascal_case() {
        let result = ExtenderFilterResult {
            node_names: Some(vec!["n1".into()]),
            failed_nodes: [("n2".to_owned(), "full".to_owned())].into(),
            failed_and_unresolvable_nodes: [("n3".to_owned(), "no GPUs".to_owned())].into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({"NodeNames": ["n1"], "FailedNodes": {"n2": "full"}, "FailedAndUnresolvableNodes": {"n3": "no GPUs"}, "Error": ""})
        );
        let none_fit = ExtenderFilterResult {
            node_names: Some(vec![]),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&none_fit).unwrap()["NodeNames"],
            json!([])
        );
    }

    #[test]
    fn priorities_and_binding_match_the_go_types() {
        let priorities = vec![HostPriority {
            host: "n1".into(),
            score: 7,
        }];
        assert_eq!(
            serde_json::to_value(&priorities).unwrap(),
            json!([{"Host": "n1", "Score": 7}])
        );
        let sent = json!({"PodName": "p", "PodNamespace": "d", "PodUID": "u-1", "Node": "n1"});
        let args: ExtenderBindingArgs = serde_json::from_value(sent.clone()).unwrap();
        assert_eq!(args.pod_uid, "u-1");
        assert_eq!(serde_json::to_value(&args).unwrap(), sent);
        assert_eq!(
            serde_json::to_value(ExtenderBindingResult::default()).unwrap(),
            json!({"Error": ""})
        );
    }
}
