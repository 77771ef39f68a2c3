//! Filter and Prioritize: answered from the projection, with no side effects.

use tessera_scheduling::request::{PodRequest, parse_pod};

use super::wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, NodeItems};
use crate::{
    config::Config,
    engine::{self, quota},
    projection::Projection,
};

/// Why a node is not a candidate at all.
pub const NO_GPU_NODE: &str =
    "no GPUs registered: Tessera's node agent has not published a GpuNode for this node";

/// Why a node with GPUs is skipped while its agent says it is not Ready.
pub const NOT_READY: &str = "node agent not ready (the kubelet would reject the pod): ";

/// How the reason of a node refused for the namespace's device quota
/// starts; the node is unresolvable (no preemption makes room in a quota).
pub const OVER_QUOTA: &str = "the pod's namespace is at its device quota: ";

/// Which candidates can take the pod, and why the others cannot.
///
/// Cost: O(candidates × devices) against the in-memory ledger; nothing is
/// rebuilt and nothing is written.
pub fn filter(
    projection: &Projection,
    config: &Config,
    args: &ExtenderArgs,
) -> ExtenderFilterResult {
    let candidates = args.candidate_names();
    let mut request = match parse_pod(&args.pod, &config.request) {
        Ok(Some(request)) => request,
        Ok(None) => {
            let all = candidates.into_iter().map(str::to_owned).collect();
            return answer(args, all, Default::default(), Default::default());
        }
        Err(error) => {
            return ExtenderFilterResult {
                error: error.to_string(),
                ..Default::default()
            };
        }
    };
    if !projection.is_synced() {
        return ExtenderFilterResult {
            error: "Tessera's GPU inventory is still loading; the pod will be retried".into(),
            ..Default::default()
        };
    }
    let policy = config.gpu_policy_of(&mut request.options);
    let namespace = args.pod.metadata.namespace.as_deref().unwrap_or("default");
    let limits = projection.quota_limits(namespace, &config.request);
    let ledger = projection.read();
    // Slices held for this very pod, which preempted others (see
    // `preempt`), are its own: it fits into them, and its namespace's use
    // counts them once.
    let held = held_for(&ledger, &args.pod);
    let mut used = std::borrow::Cow::Borrowed(ledger.namespace_used(namespace));
    if let Some(held) = held {
        quota::accumulate(used.to_mut(), &held.quota, false);
    }
    let used = used.as_ref();
    // What the pod counts wherever it goes: when that alone is over, every
    // node says so without placing the pod. A namespace without device
    // limits skips all of it.
    let (names, everywhere) = if limits.is_empty() {
        (Vec::new(), None)
    } else {
        let names = quota::names(&request, &config.request);
        let everywhere = quota::check(&limits, used, &quota::least_charge(&request, &names))
            .err()
            .map(|over| format!("{OVER_QUOTA}{over}"));
        (names, everywhere)
    };
    let mut feasible = Vec::new();
    // What the rejecting nodes' devices lacked (the tuning guide's reasons).
    let mut lacking = Vec::new();
    let mut failed = std::collections::BTreeMap::new();
    let mut unresolvable = std::collections::BTreeMap::new();
    for name in candidates {
        match ledger.node(name) {
            None => {
                unresolvable.insert(name.to_owned(), NO_GPU_NODE.to_owned());
            }
            // A node behind the DRA door takes no HAMi-style pod, whatever
            // is preempted: unresolvable, in the node's own words.
            Some(_)
                if let Some(reason) = ledger.not_ready(name)
                    && reason.starts_with(crate::projection::DRA_DOOR) =>
            {
                unresolvable.insert(name.to_owned(), reason.to_owned());
            }
            Some(_) if let Some(reason) = ledger.not_ready(name) => {
                failed.insert(name.to_owned(), format!("{NOT_READY}{reason}"));
            }
            Some(_) if let Some(reason) = &everywhere => {
                unresolvable.insert(name.to_owned(), reason.clone());
            }
            Some(node) => {
                let node = without_hold(node, held.filter(|h| h.node == name));
                match engine::feasible(&node, &request, policy) {
                    Ok(()) if limits.is_empty() => feasible.push(name.to_owned()),
                    Ok(()) => match over_quota(&node, &request, policy, &names, &limits, used) {
                        None => feasible.push(name.to_owned()),
                        Some(reason) => {
                            unresolvable.insert(name.to_owned(), reason);
                        }
                    },
                    Err(rejection) => {
                        if let Some(lack) = rejection.lack() {
                            lacking.push((name.to_owned(), lack));
                        }
                        failed.insert(name.to_owned(), rejection.to_string());
                    }
                }
            }
        }
    }
    if let Some(uid) = args.pod.metadata.uid.as_deref() {
        if feasible.is_empty() {
            let name = args.pod.metadata.name.as_deref().unwrap_or_default();
            projection.waiting().unfit(
                uid,
                namespace,
                name,
                lacking,
                k8s_openapi::jiff::Timestamp::now(),
            );
        } else {
            projection.waiting().fit(uid);
        }
    }
    // Recorded under the read lock: a release applied after this decision
    // finds the record and tells kube-scheduler (see projection::Waiters).
    projection
        .waiters()
        .record(failed.keys().chain(unresolvable.keys()).map(String::as_str));
    drop(ledger);
    answer(args, feasible, failed, unresolvable)
}

/// The slices held for `pod` by its preemption, if any.
pub(super) fn held_for<'l>(
    ledger: &'l crate::projection::Ledger,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Option<&'l crate::projection::LiveAllocation> {
    let key = crate::projection::AllocationKey {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
    };
    ledger
        .allocation(&key)
        .filter(|a| a.nominated && Some(a.pod_uid.as_str()) == pod.metadata.uid.as_deref())
}

/// `node` as the pod sees it: without what is `held` for it there.
fn without_hold<'n>(
    node: &'n engine::NodeGpus,
    held: Option<&crate::projection::LiveAllocation>,
) -> std::borrow::Cow<'n, engine::NodeGpus> {
    match held {
        None => std::borrow::Cow::Borrowed(node),
        Some(held) => {
            let mut node = node.clone();
            crate::projection::release_allocation(&mut node, held);
            std::borrow::Cow::Owned(node)
        }
    }
}

/// Why the pod, placed on `node`, would take its namespace past a limit
/// (percentages resolve to the memory of the devices it would get there);
/// placed only when the most it could count there does not fit.
fn over_quota(
    node: &engine::NodeGpus,
    request: &PodRequest,
    policy: tessera_api::v1alpha1::SchedulingPolicy,
    names: &[tessera_scheduling::request::QuotaNames<'_>],
    limits: &quota::Limits,
    used: &quota::Charge,
) -> Option<String> {
    if quota::check(limits, used, &quota::most_charge(request, node, names)).is_ok() {
        return None;
    }
    let placement = engine::fit(node, request, policy).ok()?;
    let charge = quota::charge(request, &placement, names);
    quota::check(limits, used, &charge)
        .err()
        .map(|over| format!("{OVER_QUOTA}{over}"))
}

/// Node scores under the pod's (or the default) node policy; 0 for pods
/// without GPU requests and nodes without GPUs. A node where `pending`
/// says a Bind is under way scores 0 ([`engine::prioritized_score`]).
pub fn prioritize(
    projection: &Projection,
    config: &Config,
    args: &ExtenderArgs,
    pending: impl Fn(&str) -> bool,
) -> Vec<HostPriority> {
    let mut request: Option<PodRequest> = parse_pod(&args.pod, &config.request).ok().flatten();
    let gpu_policy = request
        .as_mut()
        .map(|r| config.gpu_policy_of(&mut r.options));
    let ledger = projection.read();
    let hosts = args.candidate_names();
    let nodes: Vec<_> = hosts.iter().map(|host| ledger.node(host)).collect();
    // Vendor topology first, compared over the candidates as HAMi does.
    let mut topology: Vec<Option<f64>> = nodes
        .iter()
        .map(|node| {
            let (request, node) = (request.as_ref()?, (*node)?);
            engine::topology_score(
                node,
                request,
                gpu_policy?,
                request
                    .options
                    .node_policy
                    .unwrap_or(config.node_scheduler_policy),
            )
        })
        .collect();
    engine::normalize_topology(&mut topology);
    hosts
        .into_iter()
        .zip(nodes)
        .zip(topology)
        .map(|((host, node), topology)| {
            let score = match (&request, node) {
                (Some(request), Some(node)) => engine::prioritized_score(
                    node,
                    request
                        .options
                        .node_policy
                        .unwrap_or(config.node_scheduler_policy),
                    pending(host),
                    topology,
                ),
                _ => 0,
            };
            HostPriority {
                host: host.to_owned(),
                score,
            }
        })
        .collect()
}

/// Answers in the form the scheduler asked in: names, or node objects.
fn answer(
    args: &ExtenderArgs,
    feasible: Vec<String>,
    failed_nodes: std::collections::BTreeMap<String, String>,
    failed_and_unresolvable_nodes: std::collections::BTreeMap<String, String>,
) -> ExtenderFilterResult {
    let nodes = args
        .nodes
        .as_ref()
        .filter(|_| args.node_names.is_none())
        .map(|sent| NodeItems {
            metadata: sent.metadata.clone(),
            items: sent
                .items
                .iter()
                .filter(|n| {
                    n["metadata"]["name"]
                        .as_str()
                        .is_some_and(|name| feasible.iter().any(|f| f == name))
                })
                .cloned()
                .collect(),
        });
    ExtenderFilterResult {
        node_names: if nodes.is_some() {
            None
        } else {
            Some(feasible)
        },
        nodes,
        failed_nodes,
        failed_and_unresolvable_nodes,
        error: String::new(),
    }
}
