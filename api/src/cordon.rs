//! Which of a node's devices are cordoned: healthy, but closed to new pods
//! while the pods on them keep running (HAMi's `hami.io/device-cordon`, a
//! live per-GPU `kubectl cordon`, and its declarative form, a
//! GpuNodeConfig's `cordonDevices`).
//!
//! Whoever publishes a node's devices marks them ([`mark`]): the node agent
//! for its GPUs, the controllers' vendor view for other vendors' devices.
//! The scheduler reads the mark from the GpuNode, so a cordon takes effect
//! as soon as the GpuNode is rewritten; nothing restarts.

use std::collections::BTreeMap;

use crate::{
    names::annotations::DEVICE_CORDON,
    v1alpha1::{FilterDevices, GpuDevice},
};

/// The device UUIDs a Node's `hami.io/device-cordon` lists, as HAMi reads
/// them: comma-separated, blanks trimmed, empty entries skipped, matched
/// exactly (UUIDs the node does not have cordon nothing).
pub fn listed(annotations: Option<&BTreeMap<String, String>>) -> Vec<&str> {
    annotations
        .and_then(|a| a.get(DEVICE_CORDON))
        .into_iter()
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|uuid| !uuid.is_empty())
        .collect()
}

/// Sets each device's `cordoned_by`: the annotation when it lists the
/// device's UUID, else `GpuNodeConfig/<config>` when the config's
/// `cordonDevices` picks it (by UUID or index), else none.
pub fn mark(
    devices: &mut [GpuDevice],
    node_annotations: Option<&BTreeMap<String, String>>,
    by_config: &FilterDevices,
    config: Option<&str>,
) {
    let listed = listed(node_annotations);
    for device in devices {
        device.cordoned_by = if listed.contains(&device.uuid.as_str()) {
            Some(DEVICE_CORDON.to_owned())
        } else if by_config.picks(&device.uuid, device.index) {
            Some(format!("GpuNodeConfig/{}", config.unwrap_or_default()))
        } else {
            None
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::gpu;

    fn annotations(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(DEVICE_CORDON.to_owned(), value.to_owned())])
    }

    #[test]
    fn the_annotation_lists_uuids_as_hami_reads_them() {
        assert_eq!(listed(Some(&annotations("dev-1, "))), ["dev-1"]);
        assert_eq!(
            listed(Some(&annotations(" GPU-a ,,GPU-b"))),
            ["GPU-a", "GPU-b"]
        );
        assert!(listed(Some(&annotations("  "))).is_empty());
        assert!(listed(Some(&BTreeMap::new())).is_empty());
        assert!(listed(None).is_empty());
    }

    #[test]
    fn marks_name_the_annotation_or_the_config_and_clear_when_lifted() {
        let mut devices = vec![
            gpu(0, "A100", 81920),
            gpu(1, "A100", 81920),
            gpu(2, "A100", 81920),
        ];
        let uuid = |i: usize, devices: &[GpuDevice]| devices[i].uuid.clone();
        let node = annotations(&format!("{}, GPU-unknown", uuid(0, &devices)));
        let config = FilterDevices {
            uuids: vec![uuid(0, &devices)],
            indexes: vec![2],
        };
        mark(&mut devices, Some(&node), &config, Some("repair"));
        let by: Vec<Option<&str>> = devices.iter().map(|d| d.cordoned_by.as_deref()).collect();
        assert_eq!(
            by,
            [
                Some("hami.io/device-cordon"),
                None,
                Some("GpuNodeConfig/repair")
            ]
        );
        mark(&mut devices, None, &FilterDevices::default(), None);
        assert!(devices.iter().all(|d| d.cordoned_by.is_none()));
    }

    #[test]
    fn uuids_match_exactly() {
        let mut devices = vec![gpu(0, "A100", 81920)];
        mark(
            &mut devices,
            Some(&annotations("gpu-0,GPU-00")),
            &FilterDevices::default(),
            None,
        );
        assert!(devices[0].cordoned_by.is_none(), "GPU-0 is not listed");
    }
}
