//! What an AMD Allocate decides across a pod's containers: which compute
//! units each GPU slice gets (Project-HAMi/amd-device-plugin
//! `buildCUAllocations`, `cuallocation.AllocateN`, `hami.io/amd-cu-allocated`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::protocol::{cu_list, first_free_cus, parse_cu_list};

/// The pod annotation the AMD plugin records a pod's compute units in: a
/// JSON object from GPU UUID to CU list.
pub const CU_ALLOCATED: &str = "hami.io/amd-cu-allocated";

/// Compute units held on the node and taken by this Allocate call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocateState {
    held: BTreeMap<String, BTreeSet<u32>>,
    taken: BTreeMap<String, BTreeSet<u32>>,
}

impl AllocateState {
    /// The units the node's pods hold, from their annotations (pods that
    /// ended hold none); two pods holding one unit is an error, as the
    /// plugin fails closed.
    pub fn from_pods(pods: &[Pod]) -> Result<Self, String> {
        let mut state = Self::default();
        for pod in pods {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            let Some(value) = pod.annotations().get(CU_ALLOCATED) else {
                continue;
            };
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            for (uuid, cus) in parse_map(value).map_err(|e| format!("pod {key}: {e}"))? {
                let held = state.held.entry(uuid.clone()).or_default();
                if let Some(cu) = cus.iter().find(|cu| held.contains(cu)) {
                    return Err(format!(
                        "CU allocation overlap on device {uuid} CU {cu} (pod {key})"
                    ));
                }
                held.extend(cus);
            }
        }
        Ok(state)
    }

    /// Takes the `n` lowest free units of GPU `uuid` (of `total`).
    pub fn take_cus(&mut self, uuid: &str, total: u32, n: u32) -> Result<BTreeSet<u32>, String> {
        let held = self.held.entry(uuid.to_owned()).or_default();
        let cus = first_free_cus(held, total, n)
            .ok_or_else(|| format!("allocate cu for {uuid}: {n} of {total} CUs are not free"))?;
        held.extend(cus.iter().copied());
        self.taken
            .entry(uuid.to_owned())
            .or_default()
            .extend(cus.iter().copied());
        Ok(cus)
    }

    /// The pod's annotation after this call: its `previous` lists merged
    /// with what was taken; `None` when nothing was.
    pub fn pod_annotation(&self, previous: Option<&str>) -> Result<Option<String>, String> {
        if self.taken.is_empty() {
            return Ok(None);
        }
        let mut merged = previous.map(parse_map).transpose()?.unwrap_or_default();
        for (uuid, cus) in &self.taken {
            merged.entry(uuid.clone()).or_default().extend(cus);
        }
        let lists: BTreeMap<&String, String> = merged
            .iter()
            .map(|(uuid, cus)| (uuid, cu_list(cus)))
            .collect();
        serde_json::to_string(&lists)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

fn parse_map(value: &str) -> Result<BTreeMap<String, BTreeSet<u32>>, String> {
    let lists: BTreeMap<String, String> = serde_json::from_str(value)
        .map_err(|e| format!("{CU_ALLOCATED} is not a JSON object of CU lists: {e}"))?;
    lists
        .into_iter()
        .map(|(uuid, list)| Ok((uuid, parse_cu_list(&list)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, phase: &str, cus: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default",
                "annotations": {CU_ALLOCATED: cus.to_string()}},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn units_come_first_fit_around_the_nodes_pods_and_overlaps_fail_closed() {
        let pods = [
            pod("a", "Running", json!({"GPU-0": "0-75"})),
            pod("gone", "Succeeded", json!({"GPU-0": "76-151"})),
        ];
        let mut state = AllocateState::from_pods(&pods).unwrap();
        let cus = state.take_cus("GPU-0", 304, 76).unwrap();
        assert_eq!(cu_list(&cus), "76-151", "the ended pod's units are free");
        assert_eq!(
            state.pod_annotation(Some(r#"{"GPU-1":"0-3"}"#)).unwrap(),
            Some(r#"{"GPU-0":"76-151","GPU-1":"0-3"}"#.to_owned())
        );
        assert!(state.take_cus("GPU-0", 304, 200).is_err());
        let overlapping = [
            pod("a", "Running", json!({"GPU-0": "0-75"})),
            pod("b", "Pending", json!({"GPU-0": "70-80"})),
        ];
        let error = AllocateState::from_pods(&overlapping).unwrap_err();
        assert!(error.contains("overlap on device GPU-0 CU 70"), "{error}");
        assert_eq!(AllocateState::default().pod_annotation(None).unwrap(), None);
    }
}
