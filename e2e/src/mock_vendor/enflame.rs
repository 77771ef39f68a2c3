//! Enflame's DRS device plugin (EnflameTechnology/gcushare,
//! `gcushare-device-plugin`: `pkg/device/device.go` `GetFakeDevices`,
//! `pkg/resource/node.go` `PatchDRSGCUCapacityToNode`, `pkg/server/server.go`
//! `Allocate` and `getAssumePod`, `pkg/resource/pod.go` `GetCandidatePods`
//! and `PodExistContainerCanBind`, `makeContainerResponse`), the plugin
//! HAMi's Enflame DRS support is written for (gcushare-device-plugin 2.2.14
//! or newer, without gcushare's scheduler plugin):
//!
//! - it registers `enflame.com/drs-gcu` with 6 devices per GCU
//!   (`<minor>-<slice>`) and lists its GCUs and profiles in the Node
//!   annotation `enflame.com/gcu-drs-capacity`;
//! - Allocate serves one container: among the node's pending pods with a
//!   `drs-gcu` limit and `enflame.com/gcu-assigned-time`, oldest first, the
//!   first container not yet `allocated` in `assigned-containers` whose
//!   limit equals the number of devices asked for; it creates the DRS
//!   instance of that container's profile on the GCU of
//!   `enflame.com/gcu-assigned-index`, marks the container allocated (and
//!   the pod `enflame.com/gcu-assigned: "true"` with its last container),
//!   and answers `ENFLAME_VISIBLE_DEVICES=<gcu-assigned-minor>` and
//!   `TOPS_VISIBLE_DEVICES=DRS-<instance UUID>`.
//!
//! The driver's refusal to create an instance the GCU has no slices for is
//! played by counting the instances the node's unfinished pods hold.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tessera_api::names::enflame::{
    ASSIGNED, ASSIGNED_CONTAINERS, ASSIGNED_INDEX, ASSIGNED_MINOR, ASSIGNED_TIME, DRS_CAPACITY,
};

use super::types::{MockDevice, Registration};

/// The resource: one device per DRS slice.
pub const DRS_GCU: &str = "enflame.com/drs-gcu";
/// Slices per GCU (gcushare's `SliceCountDRS`).
pub const SLICES: u32 = 6;
/// The profiles the mock GCUs offer: name and the plugin's id.
pub const PROFILES: [(&str, &str); 3] = [("1g.8gb", "1"), ("3g.24gb", "2"), ("6g.48gb", "3")];

/// The DRS resource, 6 devices per GCU.
pub fn registration(devices: &[MockDevice]) -> Registration {
    Registration {
        resource: DRS_GCU.into(),
        socket: "enflamegcushare-drs.sock".into(),
        devices: (0..devices.len())
            .flat_map(|minor| (0..SLICES).map(move |k| format!("{minor}-{k}")))
            .collect(),
    }
}

/// `enflame.com/gcu-drs-capacity` as `PatchDRSGCUCapacityToNode` writes it.
pub fn capacity_annotation(devices: &[MockDevice]) -> (String, String) {
    let gcus: Vec<_> = (0..devices.len())
        .map(|i| json!({"index": i.to_string(), "minor": i.to_string(), "capacity": SLICES}))
        .collect();
    let profiles: serde_json::Map<String, serde_json::Value> = PROFILES
        .iter()
        .map(|(name, id)| ((*name).to_owned(), json!(id)))
        .collect();
    (
        DRS_CAPACITY.to_owned(),
        json!({"devices": gcus, "profiles": profiles}).to_string(),
    )
}

/// One container's record in `assigned-containers` (gcushare's
/// `structs.AllocateRecord`, every field optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated: Option<bool>,
    /// Slices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<u32>,
    /// The plugin's id of the profile.
    #[serde(rename = "profileID", skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<String>,
    /// The profile (`3g.24gb`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_name: Option<String>,
    /// The instance made for the container.
    #[serde(rename = "instanceID", skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// Its UUID.
    #[serde(rename = "instanceUUID", skip_serializing_if = "Option::is_none")]
    pub instance_uuid: Option<String>,
}

fn records(pod: &Pod) -> Result<BTreeMap<String, Record>, String> {
    match pod.annotations().get(ASSIGNED_CONTAINERS) {
        Some(v) => serde_json::from_str(v)
            .map_err(|e| format!("pod {} {ASSIGNED_CONTAINERS}: {e}", pod.name_any())),
        None => Ok(BTreeMap::new()),
    }
}

/// Each container's `drs-gcu` limit, in order.
fn drs_limits(pod: &Pod) -> Vec<(String, u64)> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| {
            let limit = c.resources.as_ref()?.limits.as_ref()?.get(DRS_GCU)?;
            Some((c.name.clone(), limit.0.parse().ok()?))
        })
        .collect()
}

/// The pod and container to serve for a request of `n` devices
/// (`GetCandidatePods`, `PodExistContainerCanBind`).
pub fn assume(pods: &[Pod], n: usize) -> Result<(&Pod, String), String> {
    let mut candidates: Vec<(&Pod, u64)> = pods
        .iter()
        .filter(|p| drs_limits(p).iter().map(|(_, l)| l).sum::<u64>() > 0)
        .filter_map(|p| Some((p, p.annotations().get(ASSIGNED_TIME)?.parse().ok()?)))
        .collect();
    candidates.sort_by_key(|(_, time)| *time);
    for (pod, _) in candidates {
        let records = records(pod)?;
        let container = drs_limits(pod).into_iter().find(|(name, limit)| {
            records.get(name).is_none_or(|r| r.allocated != Some(true))
                && usize::try_from(*limit) == Ok(n)
        });
        if let Some((name, _)) = container {
            return Ok((pod, name));
        }
    }
    Err(format!(
        "invalid allocation request: unable to find pod request {DRS_GCU}: {n}"
    ))
}

/// The slices of a profile name (`3g.24gb`: 3).
fn slices(profile: &str) -> Option<u32> {
    profile.split_once('g')?.0.parse().ok()
}

/// Fails as the driver does when the GCU `index` has no room for `profile`
/// beside the instances of the node's unfinished `pods`.
pub fn check_room(pods: &[Pod], index: &str, profile: &str) -> Result<(), String> {
    let mut used = slices(profile).ok_or_else(|| format!("profile {profile} unreadable"))?;
    for pod in pods {
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if finished || pod.annotations().get(ASSIGNED_INDEX).map(String::as_str) != Some(index) {
            continue;
        }
        used += records(pod)?
            .values()
            .filter(|r| r.instance_id.is_some())
            .filter_map(|r| slices(r.profile_name.as_deref()?))
            .sum::<u32>();
    }
    if used > SLICES {
        return Err(format!(
            "create drs instance {profile} on gcu {index}: {used} of {SLICES} slices"
        ));
    }
    Ok(())
}

/// Counts the instances made, for their ids.
#[derive(Debug, Default)]
pub struct Instances(u32);

/// One Allocate call of one container asking for `n` devices.
pub async fn allocate(
    client: &Client,
    node: &str,
    n: usize,
    instances: &mut Instances,
) -> Result<BTreeMap<String, String>, String> {
    // One list serves both the pod to serve (a pending one) and the room
    // check (every unfinished pod's instances).
    let all = super::pods::pods_on(client, node, None).await?;
    let pods = super::pods::pending(&all);
    let (pod, container) = assume(&pods, n)?;
    let mut records = records(pod)?;
    let annotations = pod.annotations();
    let index = annotations.get(ASSIGNED_INDEX).cloned().unwrap_or_default();
    let record = records.entry(container.clone()).or_default();
    record.allocated = Some(true);
    if let (Some(name), Some(_)) = (&record.profile_name, &record.profile_id) {
        check_room(&all, &index, name)?;
        instances.0 += 1;
        record.instance_id = Some(instances.0.to_string());
        record.instance_uuid = Some(format!("gcu{index}-{name}-{}", instances.0));
    }
    let uuid = record.instance_uuid.clone();
    let all_allocated = drs_limits(pod)
        .iter()
        .all(|(name, _)| records.get(name).is_some_and(|r| r.allocated == Some(true)));
    let assigned = if all_allocated {
        "true".to_owned()
    } else {
        annotations.get(ASSIGNED).cloned().unwrap_or_default()
    };
    let text = serde_json::to_string(&records).map_err(|e| e.to_string())?;
    let patch =
        json!({"metadata": {"annotations": {ASSIGNED: assigned, ASSIGNED_CONTAINERS: text}}});
    Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default())
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .map_err(|e| format!("patch pod annotations: {e}"))?;
    let minor = annotations
        .get(ASSIGNED_MINOR)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            format!(
                "pod(name: {}, uuid: {}) has not been assigned device",
                pod.name_any(),
                pod.uid().unwrap_or_default()
            )
        })?;
    let mut env = BTreeMap::from([("ENFLAME_VISIBLE_DEVICES".to_owned(), minor.clone())]);
    if let Some(uuid) = uuid {
        env.insert("TOPS_VISIBLE_DEVICES".into(), format!("DRS-{uuid}"));
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, time: &str, limits: &[(&str, u32)], annotations: serde_json::Value) -> Pod {
        let containers: Vec<_> = limits
            .iter()
            .map(|(c, n)| json!({"name": c, "resources": {"limits": {DRS_GCU: n.to_string()}}}))
            .collect();
        let mut annotations = annotations;
        annotations[ASSIGNED_TIME] = json!(time);
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"containers": containers},
        }))
        .unwrap()
    }

    #[test]
    fn the_oldest_pod_with_a_matching_unallocated_container_is_served() {
        let done = json!({"c": {"allocated": true, "request": 3}});
        let older = pod(
            "older",
            "10",
            &[("c", 3)],
            json!({ASSIGNED_CONTAINERS: done.to_string()}),
        );
        let newer = pod("newer", "20", &[("a", 1), ("b", 3)], json!({}));
        let newest = pod("newest", "30", &[("c", 3)], json!({}));
        let pods = [newest, older, newer];
        let (p, c) = assume(&pods, 3).unwrap();
        assert_eq!((p.name_any().as_str(), c.as_str()), ("newer", "b"));
        assert_eq!(
            assume(&pods, 6).unwrap_err(),
            "invalid allocation request: unable to find pod request enflame.com/drs-gcu: 6"
        );
    }

    #[test]
    fn instances_beyond_a_gcu_s_slices_are_refused() {
        let held = json!({"c": {"allocated": true, "request": 3, "profileName": "3g.24gb",
            "profileID": "2", "instanceID": "1"}});
        let a = pod(
            "a",
            "1",
            &[("c", 3)],
            json!({ASSIGNED_INDEX: "0", ASSIGNED_CONTAINERS: held.to_string()}),
        );
        check_room(std::slice::from_ref(&a), "0", "3g.24gb").unwrap();
        check_room(std::slice::from_ref(&a), "1", "6g.48gb").unwrap();
        let error = check_room(&[a], "0", "6g.48gb").unwrap_err();
        assert!(error.contains("9 of 6 slices"), "{error}");
    }

    #[test]
    fn the_node_lists_6_slices_per_gcu_and_the_profiles() {
        let gcus = super::super::fleet::devices(2, "GCU", 49152, 100, None);
        assert_eq!(registration(&gcus).devices.len(), 12);
        assert_eq!(registration(&gcus).devices[7], "1-1");
        let (key, value) = capacity_annotation(&gcus);
        assert_eq!(key, "enflame.com/gcu-drs-capacity");
        let v: serde_json::Value = serde_json::from_str(&value).unwrap();
        assert_eq!(
            v["devices"][1],
            json!({"index": "1", "minor": "1", "capacity": 6})
        );
        assert_eq!(v["profiles"]["3g.24gb"], "2");
    }
}
