//! The node's settings applied to its physical GPUs: which GPUs are offered
//! and with what capacity. Pure functions.
//!
//! Precedence of the settings themselves (cluster defaults, then matching
//! GpuNodeConfigs by priority and name) is `tessera_api::node_config::resolve`.

use tessera_api::v1alpha1::{DeviceCapacity, GpuDevice, NodeSettings};

use crate::backend::PhysicalGpu;

/// The GPUs the node offers under `settings`: filtered devices left out,
/// memory scaled by `deviceMemoryScaling`, cores by `deviceCoreScaling`.
pub fn offered(physical: &[PhysicalGpu], settings: &NodeSettings) -> Vec<GpuDevice> {
    let filter = &settings.filter_devices;
    physical
        .iter()
        .filter(|d| !filter.uuids.contains(&d.uuid) && !filter.indexes.contains(&d.index))
        .map(|d| GpuDevice {
            uuid: d.uuid.clone(),
            index: d.index,
            model: d.model.clone(),
            memory_mib: d.memory_mib,
            capacity: DeviceCapacity {
                memory_mib: scale(d.memory_mib, settings.device_memory_scaling),
                cores: u32::try_from(scale(100, settings.device_core_scaling)).unwrap_or(u32::MAX),
            },
            split_count: settings.device_split_count,
            numa_node: d.numa_node,
            nvlink_peers: d.nvlink_peers.clone(),
            health: d.health,
            health_message: d.health_message.clone(),
            mode: settings.operating_mode,
            mig_instances: Vec::new(),
        })
        .collect()
}

/// `value × factor`, rounded down (a slice never promises more than exists × factor).
fn scale(value: u64, factor: f64) -> u64 {
    (value as f64 * factor).floor() as u64
}

#[cfg(test)]
mod tests {
    use tessera_api::v1alpha1::{DeviceHealth, FilterDevices, OperatingMode};

    use super::*;

    fn gpu(index: u32) -> PhysicalGpu {
        PhysicalGpu {
            uuid: format!("GPU-{index}"),
            index,
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81_920,
            numa_node: Some(index / 2),
            nvlink_peers: Vec::new(),
            health: DeviceHealth::Healthy,
            health_message: None,
        }
    }

    #[test]
    fn defaults_offer_every_gpu_unscaled() {
        let offered = offered(&[gpu(0), gpu(1)], &NodeSettings::default());
        assert_eq!(offered.len(), 2);
        assert_eq!(
            offered[1].capacity,
            DeviceCapacity {
                memory_mib: 81_920,
                cores: 100
            }
        );
        assert_eq!(offered[1].split_count, 10);
        assert_eq!(offered[1].numa_node, Some(0));
        assert_eq!(offered[1].mode, OperatingMode::HamiCore);
    }

    #[test]
    fn scaling_split_and_filters_apply() {
        let settings = NodeSettings {
            device_split_count: 4,
            device_memory_scaling: 1.5,
            device_core_scaling: 0.5,
            filter_devices: FilterDevices {
                uuids: vec!["GPU-0".into()],
                indexes: vec![2],
            },
            ..NodeSettings::default()
        };
        let offered = offered(&[gpu(0), gpu(1), gpu(2), gpu(3)], &settings);
        let uuids: Vec<&str> = offered.iter().map(|d| d.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-1", "GPU-3"]);
        assert_eq!(
            offered[0].capacity,
            DeviceCapacity {
                memory_mib: 122_880,
                cores: 50
            }
        );
        assert_eq!(
            offered[0].memory_mib, 81_920,
            "physical memory is reported unscaled"
        );
        assert_eq!(offered[0].split_count, 4);
    }
}
