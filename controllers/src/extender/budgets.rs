//! PodDisruptionBudgets for device-aware preemption, from one watch of them
//! (started at the first preemption) instead of a LIST of every budget and
//! each budget's pods per attempt (review 2026-12-01, H3: a tenant's
//! thousand budgets and a few never-fitting pods made thousands of LISTs a
//! second). A budget is looked at only for the victims a plan chose, against
//! the labels the preemptor reads when it checks each victim anyway.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::{
    Api, Client, ResourceExt,
    core::{Selector, SelectorExt},
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};

/// How long the first preemption waits for the budgets' first list.
const FIRST_LIST: Duration = Duration::from_secs(5);

/// The cluster's PodDisruptionBudgets, watched from the first use on.
#[derive(Clone)]
pub struct Budgets {
    client: Client,
    store: Arc<tokio::sync::OnceCell<Store<PodDisruptionBudget>>>,
}

impl Budgets {
    /// Budgets read through `client`; nothing is watched until the first
    /// [`Budgets::protects`].
    pub fn new(client: Client) -> Self {
        Self {
            client,
            store: Arc::default(),
        }
    }

    async fn store(&self) -> &Store<PodDisruptionBudget> {
        self.store
            .get_or_init(|| async {
                let (reader, writer) = reflector::store();
                let api: Api<PodDisruptionBudget> = Api::all(self.client.clone());
                tokio::spawn(
                    reflector(
                        writer,
                        watcher(api, watcher::Config::default()).default_backoff(),
                    )
                    .for_each(|_| std::future::ready(())),
                );
                if tokio::time::timeout(FIRST_LIST, reader.wait_until_ready())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        "PodDisruptionBudgets not listed within 5 s: preemption counts none until they are"
                    );
                }
                reader
            })
            .await
    }

    /// Whether a budget that allows no disruption now selects a pod of
    /// `namespace` with `labels`.
    pub async fn protects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let store = self.store().await;
        protects(store.state().iter().map(|b| b.as_ref()), namespace, labels)
    }
}

/// Whether any of `budgets` allows no disruption and selects a pod of
/// `namespace` with `labels` (a budget without a selector selects nothing;
/// an empty one, every pod of its namespace).
pub fn protects<'b>(
    budgets: impl IntoIterator<Item = &'b PodDisruptionBudget>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    budgets.into_iter().any(|budget| {
        let allowed = budget
            .status
            .as_ref()
            .and_then(|s| s.disruptions_allowed)
            .unwrap_or(0);
        let selector = budget.spec.as_ref().and_then(|s| s.selector.clone());
        budget.namespace().as_deref() == Some(namespace)
            && allowed <= 0
            && selector
                .and_then(|s| Selector::try_from(s).ok())
                .is_some_and(|s| s.matches(labels))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn budget(
        namespace: &str,
        selector: Option<serde_json::Value>,
        allowed: i32,
    ) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "b", "namespace": namespace},
            "spec": {"selector": selector, "minAvailable": 1},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1,
                "expectedPods": 1},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_budget_of_the_pods_namespace_allowing_nothing_protects_it() {
        let labels = BTreeMap::from([("app".to_owned(), "train".to_owned())]);
        let app = Some(json!({"matchLabels": {"app": "train"}}));
        assert!(protects([&budget("a", app.clone(), 0)], "a", &labels));
        assert!(
            !protects([&budget("a", app.clone(), 1)], "a", &labels),
            "allows one"
        );
        assert!(
            !protects([&budget("b", app, 0)], "a", &labels),
            "another namespace"
        );
        assert!(!protects(
            [&budget(
                "a",
                Some(json!({"matchLabels": {"app": "serve"}})),
                0
            )],
            "a",
            &labels
        ));
        assert!(
            protects([&budget("a", Some(json!({})), 0)], "a", &labels),
            "empty: all"
        );
        assert!(
            !protects([&budget("a", None, 0)], "a", &labels),
            "none: nothing"
        );
    }
}
