//! Device quota usage where `kubectl` shows quotas: for every ResourceQuota
//! that limits a device resource (`limits.nvidia.com/gpumem`), what the
//! namespace's GPU pods hold, in `status.used` under the same key, so
//! `kubectl describe quota` lists it beside the limit.
//!
//! The kube quota controller computes no usage for these keys (it counts
//! only `requests.` for extended resources) and keeps values it did not
//! compute, so the two writers do not fight: each merge-patches its own keys.
//! The figure is the sum of the live VgpuAllocations' `spec.quota` in the
//! namespace, in the resource's unit (memory rounded up).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::{api::core::v1::ResourceQuota, apimachinery::pkg::api::resource::Quantity};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tessera_api::v1alpha1::VgpuAllocation;
use tessera_kubekit::Watched;
use tessera_scheduling::request::{LIMITS_PREFIX, RequestConfig};

use crate::engine::quota::{self, Charge};

/// How long changes gather before the quotas are compared again.
const SETTLE: Duration = Duration::from_millis(200);

/// Keeps every device quota's `status.used` current until dropped.
pub async fn run(
    client: Client,
    quotas: Watched<ResourceQuota>,
    allocations: Watched<VgpuAllocation>,
    request: RequestConfig,
) {
    let (mut quota_changes, mut allocation_changes) = (quotas.changes(), allocations.changes());
    loop {
        let all = quotas.store().state();
        // Only namespaces with a device quota are summed (none: nothing is;
        // summing every allocation on each change took a fifth of the
        // controller's CPU in a 5,000-node burst without a single quota).
        let limited: BTreeSet<String> = all
            .iter()
            .filter(|quota| limits_devices(quota, &request))
            .map(|quota| quota.namespace().unwrap_or_default())
            .collect();
        if !limited.is_empty() {
            let held = held_by_namespace(&allocations.store().state(), &limited);
            for quota in all {
                let wanted = used_keys(&quota, &held, &request);
                if wanted.is_empty() || already(&quota, &wanted) {
                    continue;
                }
                write(&client, &quota, wanted).await;
            }
        }
        tokio::select! {
            changed = quota_changes.changed() => if changed.is_err() { return },
            changed = allocation_changes.changed() => if changed.is_err() { return },
        }
        tokio::time::sleep(SETTLE).await;
    }
}

/// Whether `quota` limits a device resource (a `limits.` key `request`
/// knows).
fn limits_devices(quota: &ResourceQuota, request: &RequestConfig) -> bool {
    crate::projection::limits_keys(quota).any(|(name, _)| request.quota_resource(name).is_some())
}

/// What the live allocations of each of `namespaces` count, by resource
/// name.
fn held_by_namespace(
    allocations: &[std::sync::Arc<VgpuAllocation>],
    namespaces: &BTreeSet<String>,
) -> BTreeMap<String, Charge> {
    let mut held: BTreeMap<String, Charge> = BTreeMap::new();
    for allocation in allocations.iter().filter(|a| a.is_live()) {
        let namespace = allocation.namespace().unwrap_or_default();
        if namespaces.contains(&namespace) {
            quota::accumulate(
                held.entry(namespace).or_default(),
                &allocation.spec.quota,
                true,
            );
        }
    }
    held
}

/// The `status.used` entries `quota` should show: one per `limits.` key of
/// a device resource, in the resource's unit.
fn used_keys(
    quota: &ResourceQuota,
    held: &BTreeMap<String, Charge>,
    request: &RequestConfig,
) -> BTreeMap<String, String> {
    let namespace = held.get(&quota.namespace().unwrap_or_default());
    crate::projection::limits_keys(quota)
        .filter_map(|(name, _)| {
            let unit = request.quota_resource(name)?.unit();
            let amount = namespace.and_then(|n| n.get(name)).copied().unwrap_or(0);
            let used = quota::in_units(amount, unit).to_string();
            Some((format!("{LIMITS_PREFIX}{name}"), used))
        })
        .collect()
}

/// Whether the quota's status already says so.
fn already(quota: &ResourceQuota, wanted: &BTreeMap<String, String>) -> bool {
    let used = quota.status.as_ref().and_then(|s| s.used.as_ref());
    wanted.iter().all(|(key, value)| {
        used.and_then(|u| u.get(key))
            .is_some_and(|shown| shown == &Quantity(value.clone()))
    })
}

async fn write(client: &Client, quota: &ResourceQuota, wanted: BTreeMap<String, String>) {
    let namespace = quota.namespace().unwrap_or_default();
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), &namespace);
    let patch = json!({"status": {"used": wanted}});
    if let Err(error) = api
        .patch_status(
            &quota.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(%namespace, quota = %quota.name_any(), %error, "could not write the device quota's usage");
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use tessera_api::testing::{allocation, container, slice};
    use tessera_scheduling::request::vendor_config;

    use super::*;

    fn quota(hard: &[(&str, &str)], used: &[(&str, &str)]) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": "q", "namespace": "ml"},
            "spec": {"hard": hard.iter().cloned().collect::<BTreeMap<_, _>>()},
            "status": {"used": used.iter().cloned().collect::<BTreeMap<_, _>>()},
        }))
        .unwrap()
    }

    #[test]
    fn usage_is_summed_per_namespace_in_the_resources_unit() {
        let mut live = allocation("a", "uid-a", "n1")
            .namespace("ml")
            .container(container("main", vec![slice("GPU-0", 0, 8000, 30)]))
            .build();
        live.spec.quota = BTreeMap::from([
            ("nvidia.com/gpumem".to_owned(), 8000),
            ("nvidia.com/gpucores".to_owned(), 30),
            ("mthreads.com/sgpu-memory".to_owned(), 1025),
        ]);
        let mut elsewhere = live.clone();
        elsewhere.metadata.namespace = Some("other".into());
        let namespaces = BTreeSet::from(["ml".to_owned()]);
        let held = held_by_namespace(&[live.into(), elsewhere.into()], &namespaces);
        assert_eq!(held.len(), 1, "only the namespaces asked for: {held:?}");
        let q = quota(
            &[
                ("limits.nvidia.com/gpumem", "16000"),
                ("limits.mthreads.com/sgpu-memory", "8"),
                ("limits.nvidia.com/gpucores", "100"),
                ("limits.cpu", "4"),
                ("requests.nvidia.com/gpumem", "4"),
            ],
            &[("limits.cpu", "1")],
        );
        let wanted = used_keys(&q, &held, &vendor_config());
        assert_eq!(
            wanted,
            BTreeMap::from([
                ("limits.mthreads.com/sgpu-memory".to_owned(), "3".to_owned()),
                ("limits.nvidia.com/gpucores".to_owned(), "30".to_owned()),
                ("limits.nvidia.com/gpumem".to_owned(), "8000".to_owned()),
            ])
        );
        assert!(!already(&q, &wanted));
        assert!(limits_devices(&q, &vendor_config()));
        let plain = quota(
            &[("limits.cpu", "4"), ("requests.nvidia.com/gpumem", "4")],
            &[],
        );
        assert!(!limits_devices(&plain, &vendor_config()));
        let shown = quota(
            &[],
            &[
                ("limits.mthreads.com/sgpu-memory", "3"),
                ("limits.nvidia.com/gpucores", "30"),
                ("limits.nvidia.com/gpumem", "8000"),
            ],
        );
        assert!(already(&shown, &wanted));
        assert_eq!(
            used_keys(&q, &BTreeMap::new(), &vendor_config())["limits.nvidia.com/gpumem"],
            "0"
        );
    }
}
