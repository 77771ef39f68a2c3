//! Configs: each GpuNodeConfig's status lists the nodes it selects and its
//! conflicts with configs of equal priority.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
    },
};
use tessera_api::{
    node_config::resolve,
    v1alpha1::{GpuNodeConfig, GpuNodeConfigStatus, NodeSettings},
};
use tessera_kubekit::Watched;

use super::caches::RETRY;
use crate::Error;

/// How often every config in the store is looked at again without a change:
/// a match or a write lost to anything (a request that hung, a wake-up
/// missed, a reconcile request the runtime dropped) is mended within it,
/// whether or not the config's last reconcile ran. A look that finds the
/// status right writes nothing.
const RESYNC: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a reconcile waits for the node list or for its status write.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs the controller on `configs`, woken by every change of `nodes`.
pub(super) async fn run(client: Client, configs: &Watched<GpuNodeConfig>, nodes: &Watched<Node>) {
    let every_config = |store: Store<GpuNodeConfig>| {
        move || {
            store
                .state()
                .into_iter()
                .map(|c| ObjectRef::from_obj(&*c))
                .collect::<Vec<_>>()
        }
    };
    let (on_node, on_config) = (every_config(configs.store()), every_config(configs.store()));
    let context = Arc::new(ConfigContext {
        client,
        configs: configs.store(),
        nodes: nodes.store(),
    });
    Controller::for_stream(configs.touched(), configs.store())
        // Matches depend on every node, and conflicts on every other config:
        // any node or config change re-reconciles all configs (writes happen
        // only where a status changes, so this settles at once).
        .watches_stream(nodes.touched(), move |_: Node| on_node())
        .watches_stream(configs.touched(), move |_| on_config())
        // Not a requeue per config: one that never reconciled (kube-runtime
        // drops a request whose object it cannot find in the store, and
        // requeues nothing for it) would never be looked at again.
        // The first tick is a minute in: the first list reconciles them all.
        .reconcile_all_on(futures::stream::unfold(
            tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC),
            |mut every| async move {
                every.tick().await;
                Some(((), every))
            },
        ))
        .run(
            reconcile_config,
            |config, error, _| {
                tracing::warn!(config = %config.name_any(), %error, "GpuNodeConfig status failed; retrying");
                Action::requeue(RETRY)
            },
            context,
        )
        .for_each(|_| async {})
        .await;
}

struct ConfigContext {
    client: Client,
    configs: Store<GpuNodeConfig>,
    nodes: Store<Node>,
}

async fn reconcile_config(
    config: Arc<GpuNodeConfig>,
    ctx: Arc<ConfigContext>,
) -> Result<Action, Error> {
    let name = config.name_any();
    tracing::debug!(config = %name, "reconciling GpuNodeConfig");
    // Matching against a half-filled node cache would publish wrong matches.
    if within("listing the Nodes", ctx.nodes.wait_until_ready())
        .await?
        .is_err()
    {
        return Ok(Action::requeue(RETRY));
    }
    let all: Vec<GpuNodeConfig> = ctx.configs.state().iter().map(|c| (**c).clone()).collect();
    let mut matched = Vec::new();
    let mut conflicts = Vec::new();
    for node in ctx.nodes.state() {
        let labels = node.labels().clone();
        let node_name = node.name_any();
        if !config.selects(&node_name, &labels) {
            continue;
        }
        matched.push(node_name.clone());
        let resolved = resolve(&node_name, &labels, &NodeSettings::default(), &all);
        conflicts.extend(
            resolved
                .conflicts
                .into_iter()
                .filter(|c| c.configs.contains(&name)),
        );
    }
    matched.sort();
    let status = GpuNodeConfigStatus {
        observed_generation: config.metadata.generation,
        matched_node_count: u32::try_from(matched.len()).unwrap_or(u32::MAX),
        matched_nodes: matched,
        conflicts,
        conditions: config
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
        tuning: config.status.as_ref().and_then(|s| s.tuning.clone()),
    };
    if config.status.as_ref() != Some(&status) {
        let api: Api<GpuNodeConfig> = Api::all(ctx.client.clone());
        // All of it but the conditions and the tuning advice, which are
        // not this controller's (left out, they are neither claimed nor
        // changed). A field it leaves empty now is removed.
        let ours = GpuNodeConfigStatus {
            conditions: Vec::new(),
            tuning: None,
            ..status
        };
        within(
            "writing GpuNodeConfig status",
            crate::STATUS.apply_at(&api, &name, None, &ours),
        )
        .await?
        .map_err(Error::kube("writing GpuNodeConfig status"))?;
        tracing::info!(config = %name, matched = ?ours.matched_nodes, conflicts = ours.conflicts.len(), "GpuNodeConfig status written");
    }
    Ok(Action::await_change())
}

/// `work`'s output, or [`Error::TimedOut`] naming `what` after [`PATIENCE`].
async fn within<T>(what: &str, work: impl std::future::Future<Output = T>) -> Result<T, Error> {
    tokio::time::timeout(PATIENCE, work)
        .await
        .map_err(|_| Error::TimedOut {
            what: what.into(),
            seconds: PATIENCE.as_secs(),
        })
}
