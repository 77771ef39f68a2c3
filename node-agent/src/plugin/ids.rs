//! Device IDs the agent advertises: `split count` replicas of each GPU,
//! `<uuid>::<replica>`, so the kubelet can hand one GPU to several pods.

use tessera_api::v1alpha1::{DeviceHealth, GpuDevice};
use tessera_deviceplugin::{
    HEALTHY, UNHEALTHY,
    v1beta1::{Device, NumaNode, TopologyInfo},
};

const SEPARATOR: &str = "::";

/// The ID of replica `replica` of the GPU `uuid`.
pub fn replica_id(uuid: &str, replica: u32) -> String {
    format!("{uuid}{SEPARATOR}{replica}")
}

/// The GPU UUID a device ID names (the ID itself if it is not a replica ID).
pub fn uuid_of(id: &str) -> &str {
    id.rsplit_once(SEPARATOR).map_or(id, |(uuid, _)| uuid)
}

/// The kubelet's device list: every replica of every offered GPU, with the
/// GPU's health and NUMA node. Unhealthy GPUs stay listed as `Unhealthy`
/// so the kubelet stops handing them out, and come back when they recover.
pub fn device_list(devices: &[GpuDevice]) -> Vec<Device> {
    devices
        .iter()
        .flat_map(|d| {
            let health = if d.health == DeviceHealth::Healthy {
                HEALTHY
            } else {
                UNHEALTHY
            };
            let topology = d.numa_node.map(|n| TopologyInfo {
                nodes: vec![NumaNode { id: i64::from(n) }],
            });
            (0..d.split_count).map(move |r| Device {
                id: replica_id(&d.uuid, r),
                health: health.to_owned(),
                topology: topology.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_round_trip_and_carry_health_and_numa() {
        assert_eq!(uuid_of(&replica_id("GPU-a-b", 3)), "GPU-a-b");
        assert_eq!(uuid_of("GPU-plain"), "GPU-plain");
        let devices = vec![
            GpuDevice {
                family: Default::default(),
                network_id: None,
                uuid: "GPU-0".into(),
                split_count: 2,
                numa_node: Some(1),
                health: DeviceHealth::Healthy,
                ..Default::default()
            },
            GpuDevice {
                family: Default::default(),
                network_id: None,
                uuid: "GPU-1".into(),
                split_count: 3,
                health: DeviceHealth::Unhealthy,
                ..Default::default()
            },
        ];
        let list = device_list(&devices);
        let ids: Vec<&str> = list.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1", "GPU-1::2"]
        );
        assert_eq!(list[0].health, HEALTHY);
        assert_eq!(list[0].topology.as_ref().unwrap().nodes[0].id, 1);
        assert!(list[2].topology.is_none());
        assert!(list[2..].iter().all(|d| d.health == UNHEALTHY));
    }
}
