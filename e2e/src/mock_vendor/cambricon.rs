//! Cambricon's device plugin in dynamic-smlu mode
//! (Cambricon/cambricon-k8s-device-plugin, `device-plugin/pkg/mlu`:
//! `cambricon.go` `GetDevices`, `server.go` `Serve`, `allocateDynamicSmlu`
//! and `PrepareResponse` with `UseRuntime`, `podutils.go`
//! `getDynamicSmluCandidatePod`, `GetProfileFromAnnotation` and
//! `releaseNodeLock`; run with `--min-dsmlu-unit=256`, the unit HAMi counts
//! `mlu.smlu.vmemory` in):
//!
//! - it registers `cambricon.com/mlu.smlu.vcore` (100 per MLU),
//!   `cambricon.com/mlu.smlu.vmemory` (one per 256 MiB) and
//!   `cambricon.com/real-mlu-counts` (one per MLU), and writes no Node
//!   annotation: HAMi reads the Node's capacity;
//! - the kubelet calls Allocate once per resource for the container. The
//!   first call finds the one pending pod on the node that asks for smlu
//!   resources and says `CAMBRICON_DSMLU_ASSIGHED: "false"`, reads
//!   `CAMBRICON_DSMLU_PROFILE` (`<slot>_<vcore>_<vmemory>`), creates the
//!   smlu instance and keeps the answer; the second call answers the same,
//!   marks the pod `CAMBRICON_DSMLU_ASSIGHED: "true"` with
//!   `CAMBRICON_DSMLU_PROFILE_INSTANCE`, and removes the Node's
//!   `cambricon.com/dsmlu.lock`.
//!
//! The driver's refusal to create an instance the MLU has no room for is
//! played by counting the profiles of the node's assigned pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tessera_api::names::cambricon::{
    DSMLU_ASSIGNED_BY_PLUGIN, DSMLU_LOCK, DSMLU_PROFILE, MEMORY_UNIT_MIB,
};

use super::types::{MockDevice, Registration};

/// The cores resource.
pub const VCORE: &str = "cambricon.com/mlu.smlu.vcore";
/// The memory resource, in 256 MiB units.
pub const VMEMORY: &str = "cambricon.com/mlu.smlu.vmemory";
/// The whole-MLU count the plugin registers beside them.
pub const REAL_COUNTS: &str = "cambricon.com/real-mlu-counts";
/// Where the plugin records the instance it made: `<profile>_<instance
/// handle>_<slot>_<instance>`.
pub const PROFILE_INSTANCE: &str = "CAMBRICON_DSMLU_PROFILE_INSTANCE";
/// The variable the runtime reads the smlu's device nodes from.
pub const VIRTUAL_DEVICES: &str = "VIRTUAL_DEVICES";
/// The mock's record of the instance's size: `<slot>:<MiB>:<vcore>`.
pub const MOCK_DSMLU: &str = "TESSERA_MOCK_DSMLU";

/// The three resources, with Cambricon's device IDs and sockets.
pub fn registrations(devices: &[MockDevice]) -> Vec<Registration> {
    let fake = |profile: &str, per_device: &dyn Fn(&MockDevice) -> u64| {
        devices
            .iter()
            .flat_map(|d| (1..=per_device(d)).map(move |i| format!("{}-{profile}-{i}", d.id)))
            .collect()
    };
    vec![
        Registration {
            resource: VCORE.into(),
            socket: "vcore.sock".into(),
            devices: fake("vcore", &|_| 100),
        },
        Registration {
            resource: VMEMORY.into(),
            socket: "vmemory.sock".into(),
            devices: fake("vmemory", &|d| d.memory_mib / MEMORY_UNIT_MIB),
        },
        Registration {
            resource: REAL_COUNTS.into(),
            socket: "real-mlu-counts.sock".into(),
            devices: devices
                .iter()
                .map(|d| format!("real-mlu-counts-{}", d.id))
                .collect(),
        },
    ]
}

/// An smlu profile: the MLU's slot, its cores and its memory in 256 MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The MLU's index.
    pub slot: usize,
    /// Cores, percent of the MLU.
    pub vcore: u64,
    /// Memory, 256 MiB units.
    pub vmemory: u64,
}

/// `CAMBRICON_DSMLU_PROFILE` as `GetProfileFromAnnotation` reads it.
pub fn profile(pod: &Pod) -> Result<Profile, String> {
    let value = pod
        .annotations()
        .get(DSMLU_PROFILE)
        .ok_or_else(|| format!("pod annotation {DSMLU_PROFILE} not found"))?;
    let parts: Vec<&str> = value.split('_').collect();
    let [slot, vcore, vmemory] = parts.as_slice() else {
        return Err(format!("invalid pod annotation {value}"));
    };
    let number = |v: &str| {
        v.parse::<u64>()
            .map_err(|e| format!("strconv value {v}, {e}"))
    };
    Ok(Profile {
        slot: usize::try_from(number(slot)?).map_err(|e| e.to_string())?,
        vcore: number(vcore)?,
        vmemory: number(vmemory)?,
    })
}

/// Whether a container limit is an smlu resource (`requestsDynamicSmlu`).
fn smlu_limits(pod: &Pod) -> impl Iterator<Item = usize> + '_ {
    pod.spec.iter().flat_map(|s| &s.containers).map(|c| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .map_or(0, |limits| {
                limits
                    .iter()
                    .filter(|(k, v)| {
                        k.starts_with("cambricon.com/")
                            && (k.ends_with(".vcore") || k.ends_with(".vmemory"))
                            && v.0 != "0"
                    })
                    .count()
            })
    })
}

/// The one pod to serve among the node's pending `pods`
/// (`getDynamicSmluCandidatePod`).
pub fn candidate(pods: &[Pod]) -> Result<&Pod, String> {
    let assumed: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            smlu_limits(p).any(|n| n > 0)
                && p.annotations()
                    .get(DSMLU_ASSIGNED_BY_PLUGIN)
                    .map(String::as_str)
                    == Some("false")
        })
        .collect();
    let pod = match assumed.as_slice() {
        [] => return Err("no dynamic smlu candidate pod found".into()),
        [one] => *one,
        _ => return Err("number of dynamic smlu candidate pods large than one".into()),
    };
    if smlu_limits(pod).filter(|n| *n > 0).count() > 1 {
        return Err("number of containers of dynamic smlu candidate pod large than one".into());
    }
    Ok(pod)
}

/// Fails as the driver does when `wanted` does not fit beside the smlu
/// instances of the node's other assigned, unfinished `pods`.
pub fn check_room(
    devices: &[MockDevice],
    pods: &[Pod],
    serving: &Pod,
    wanted: Profile,
) -> Result<(), String> {
    let device = devices
        .get(wanted.slot)
        .ok_or_else(|| format!("failed GetDeviceUUIDByIndex {}", wanted.slot))?;
    let mut used = (wanted.vcore, wanted.vmemory);
    for pod in pods {
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let assigned = pod
            .annotations()
            .get(DSMLU_ASSIGNED_BY_PLUGIN)
            .map(String::as_str)
            == Some("true");
        if finished || !assigned || pod.uid() == serving.uid() {
            continue;
        }
        let held = profile(pod)?;
        if held.slot == wanted.slot {
            used.0 += held.vcore;
            used.1 += held.vmemory;
        }
    }
    let units = device.memory_mib / MEMORY_UNIT_MIB;
    if used.0 > 100 || used.1 > units {
        return Err(format!(
            "failed to create smlu profile {wanted:?}: MLU {} would hold {} vcore of 100 and {} vmemory of {units}",
            wanted.slot, used.0, used.1
        ));
    }
    Ok(())
}

/// The container's variables for an instance (`PrepareResponse` with
/// `UseRuntime`: the smlu's device nodes in `VIRTUAL_DEVICES`).
pub fn env(wanted: Profile, instance: u32) -> BTreeMap<String, String> {
    let slot = wanted.slot;
    BTreeMap::from([
        (
            VIRTUAL_DEVICES.to_owned(),
            format!(
                "/dev/cambricon_dev{slot},/dev/cambricon_ipcm{slot},/dev/cambricon-caps/cap_dev{slot}_mi{instance}"
            ),
        ),
        (
            MOCK_DSMLU.to_owned(),
            format!(
                "{slot}:{}:{}",
                wanted.vmemory * MEMORY_UNIT_MIB,
                wanted.vcore
            ),
        ),
    ])
}

/// What one Allocate keeps for the second: the pod, its answer and its
/// instance record (the plugin's `dynamicSmlu`, `profileAndInstance`).
#[derive(Clone, Debug, Default)]
pub struct Pending {
    made: Option<(String, BTreeMap<String, String>, String)>,
    instances: u32,
}

/// One Allocate call: the container's variables.
pub async fn allocate(
    client: &Client,
    node: &str,
    devices: &[MockDevice],
    pending: &mut Pending,
) -> Result<BTreeMap<String, String>, String> {
    // One list serves both the candidate (a pending pod) and the room
    // check (every unfinished pod's instance).
    let all = match super::pods::pods_on(client, node, None).await {
        Ok(all) => all,
        Err(e) => {
            pending.made = None;
            return Err(e);
        }
    };
    let pods = super::pods::pending(&all);
    let pod = match candidate(&pods) {
        Ok(pod) => pod,
        Err(e) => {
            pending.made = None;
            return Err(format!(
                "failed to get dynamic smlu candidate pods, err {e}"
            ));
        }
    };
    if let Some((name, envs, instance)) = pending.made.take()
        && name == pod.name_any()
    {
        let assigned = json!({"metadata": {"annotations": {
            DSMLU_ASSIGNED_BY_PLUGIN: "true", PROFILE_INSTANCE: instance}}});
        Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default())
            .patch(&name, &PatchParams::default(), &Patch::Merge(assigned))
            .await
            .map_err(|e| format!("patchPodAnnotation {e}"))?;
        release_lock(client, node).await;
        return Ok(envs);
    }
    let wanted = profile(pod).map_err(|e| format!("get profile from annotation {e}"))?;
    check_room(devices, &all, pod, wanted)?;
    pending.instances += 1;
    let envs = env(wanted, pending.instances);
    let record = format!(
        "{}_{}_{}_{}",
        pending.instances,
        (pending.instances << 8) | u32::try_from(wanted.slot).unwrap_or(0),
        wanted.slot,
        pending.instances
    );
    pending.made = Some((pod.name_any(), envs.clone(), record));
    Ok(envs)
}

/// Removes the Node's `cambricon.com/dsmlu.lock` if present (best effort,
/// as the plugin logs and goes on).
async fn release_lock(client: &Client, node: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let held = nodes
        .get(node)
        .await
        .is_ok_and(|n| n.annotations().contains_key(DSMLU_LOCK));
    if !held {
        return;
    }
    let remove = json!({"metadata": {"annotations": {DSMLU_LOCK: null}}});
    if let Err(error) = nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(remove))
        .await
    {
        tracing::warn!(%error, "failed to release node lock {DSMLU_LOCK}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, assigned: &str, profile: &str, limits: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": name, "annotations": {
                DSMLU_ASSIGNED_BY_PLUGIN: assigned, DSMLU_PROFILE: profile}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }))
        .unwrap()
    }

    fn smlu() -> serde_json::Value {
        json!({VCORE: "30", VMEMORY: "16", "cambricon.com/vmlu": "1"})
    }

    fn mlus() -> Vec<MockDevice> {
        super::super::fleet::devices(2, "MLU", 16384, 100, None)
    }

    #[test]
    fn registrations_are_cambricon_s_three_resources() {
        let r = registrations(&mlus());
        assert_eq!(r[0].resource, VCORE);
        assert_eq!(r[0].devices.len(), 200);
        assert_eq!(r[0].devices[0], "MLU-0-vcore-1");
        assert_eq!(r[1].resource, VMEMORY);
        assert_eq!(r[1].devices.len(), 128, "16 GiB in 256 MiB units, twice");
        assert_eq!(
            r[2].devices,
            ["real-mlu-counts-MLU-0", "real-mlu-counts-MLU-1"]
        );
    }

    #[test]
    fn the_candidate_is_the_one_unassigned_smlu_pod() {
        let waiting = pod("a", "false", "0_30_16", smlu());
        let served = pod("b", "true", "0_30_16", smlu());
        let plain = pod("c", "false", "0_30_16", json!({"cpu": "1"}));
        assert_eq!(
            candidate(&[served.clone(), waiting.clone(), plain])
                .unwrap()
                .name_any(),
            "a"
        );
        assert_eq!(
            candidate(&[served]).unwrap_err(),
            "no dynamic smlu candidate pod found"
        );
        let again = pod("d", "false", "1_30_16", smlu());
        assert_eq!(
            candidate(&[waiting, again]).unwrap_err(),
            "number of dynamic smlu candidate pods large than one"
        );
    }

    #[test]
    fn profiles_are_read_as_the_plugin_reads_them() {
        let p = pod("a", "false", "1_30_16", smlu());
        assert_eq!(
            profile(&p).unwrap(),
            Profile {
                slot: 1,
                vcore: 30,
                vmemory: 16
            }
        );
        assert_eq!(
            profile(&pod("a", "false", "1_30", smlu())).unwrap_err(),
            "invalid pod annotation 1_30"
        );
        assert!(
            profile(&pod("a", "false", "x_30_16", smlu()))
                .unwrap_err()
                .starts_with("strconv value x")
        );
    }

    #[test]
    fn an_instance_the_mlu_has_no_room_for_is_refused() {
        let held = pod("held", "true", "0_80_40", smlu());
        let serving = pod("new", "false", "0_30_16", smlu());
        let wanted = profile(&serving).unwrap();
        let error =
            check_room(&mlus(), &[held.clone(), serving.clone()], &serving, wanted).unwrap_err();
        assert!(error.contains("110 vcore of 100"), "{error}");
        let other_slot = Profile { slot: 1, ..wanted };
        check_room(&mlus(), &[held, serving.clone()], &serving, other_slot).unwrap();
        let missing = Profile { slot: 2, ..wanted };
        assert_eq!(
            check_room(&mlus(), &[], &serving, missing).unwrap_err(),
            "failed GetDeviceUUIDByIndex 2"
        );
        let vars = env(wanted, 3);
        assert_eq!(
            vars[VIRTUAL_DEVICES],
            "/dev/cambricon_dev0,/dev/cambricon_ipcm0,/dev/cambricon-caps/cap_dev0_mi3"
        );
        assert_eq!(vars[MOCK_DSMLU], "0:4096:30");
    }
}
