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

/// What the preempt verb receives: kube-scheduler's candidate victims per
/// node, from its own dry run.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionArgs {
    /// The pod that would preempt.
    pub pod: Pod,
    /// Victims as whole pods, when the extender is not node-cache capable.
    #[serde(default)]
    pub node_name_to_victims: Option<BTreeMap<String, Victims>>,
    /// Victims by UID, when the extender is node-cache capable.
    #[serde(default)]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

impl ExtenderPreemptionArgs {
    /// Per node, the UIDs of kube-scheduler's victims and how many
    /// PodDisruptionBudgets they violate, from whichever form was sent.
    pub fn victims(&self) -> BTreeMap<String, MetaVictims> {
        if let Some(meta) = &self.node_name_to_meta_victims {
            return meta.clone();
        }
        let whole = self.node_name_to_victims.iter().flatten();
        whole
            .map(|(node, victims)| {
                let pods = victims
                    .pods
                    .iter()
                    .filter_map(|p| p.metadata.uid.clone())
                    .map(|uid| MetaPod { uid })
                    .collect();
                (
                    node.clone(),
                    MetaVictims {
                        pods,
                        num_pdb_violations: victims.num_pdb_violations,
                    },
                )
            })
            .collect()
    }
}

/// Victims on one node, as whole pods.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Victims {
    /// The pods.
    #[serde(default)]
    pub pods: Vec<Pod>,
    /// How many of them a PodDisruptionBudget protects.
    #[serde(default, rename = "NumPDBViolations")]
    pub num_pdb_violations: i64,
}

/// A pod, by UID.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetaPod {
    /// The pod's UID.
    #[serde(rename = "UID")]
    pub uid: String,
}

/// Victims on one node, by UID.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct MetaVictims {
    /// The pods.
    #[serde(default)]
    pub pods: Vec<MetaPod>,
    /// How many of them a PodDisruptionBudget protects.
    #[serde(default, rename = "NumPDBViolations")]
    pub num_pdb_violations: i64,
}

/// The preempt verb's answer: the nodes where preemption would work, each
/// with every pod that must go.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionResult {
    /// Victims per node.
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
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
    fn preemption_matches_the_go_types() {
        // Node-cache capable: victims by UID, NodeNameToVictims null.
        let sent = json!({"Pod": {"metadata": {"name": "p"}}, "NodeNameToVictims": null, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u-1"}], "NumPDBViolations": 1}}});
        let args: ExtenderPreemptionArgs = serde_json::from_value(sent).unwrap();
        let victims = args.victims();
        assert_eq!(victims["n1"].pods, [MetaPod { uid: "u-1".into() }]);
        assert_eq!(victims["n1"].num_pdb_violations, 1);
        // Not node-cache capable: whole pods.
        let sent = json!({"Pod": {"metadata": {"name": "p"}}, "NodeNameToVictims": {"n2": {"Pods": [{"metadata": {"name": "v", "uid": "u-2"}}], "NumPDBViolations": 0}}, "NodeNameToMetaVictims": null});
        let args: ExtenderPreemptionArgs = serde_json::from_value(sent).unwrap();
        assert_eq!(args.victims()["n2"].pods, [MetaPod { uid: "u-2".into() }]);
        let result = ExtenderPreemptionResult {
            node_name_to_meta_victims: [("n1".to_owned(), victims["n1"].clone())].into(),
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u-1"}], "NumPDBViolations": 1}}})
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
