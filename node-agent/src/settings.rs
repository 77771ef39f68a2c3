//! The node's settings applied to its physical GPUs: which GPUs are offered
//! and with what capacity. Pure functions.
//!
//! Precedence of the settings themselves (cluster defaults, then matching
//! GpuNodeConfigs by priority and name) is `tessera_api::node_config::resolve`.

use tessera_api::v1alpha1::{DeviceCapacity, GpuDevice, NodeSettings};

use crate::{backend::PhysicalGpu, holders::MigHolders};

/// The GPUs the node offers under `settings`: filtered devices left out,
/// memory scaled by `deviceMemoryScaling`, cores by `deviceCoreScaling`,
/// and each offered as the node's sharing mode offers it (the whole GPU,
/// its MIG layout, or its instances: [`crate::sharing::offering`]).
/// `holders` names the allocation holding each MIG instance.
pub fn offered(
    physical: &[PhysicalGpu],
    settings: &NodeSettings,
    holders: &MigHolders,
) -> Vec<GpuDevice> {
    let offering = crate::sharing::offering(crate::sharing::Mode::of(settings));
    let filter = &settings.filter_devices;
    physical
        .iter()
        .filter(|d| !filter.uuids.contains(&d.uuid) && !filter.indexes.contains(&d.index))
        .flat_map(|d| {
            let whole = GpuDevice {
                cordoned_by: None,
                family: Default::default(),
                network_id: None,
                uuid: d.uuid.clone(),
                index: d.index,
                model: d.model.clone(),
                memory_mib: d.memory_mib,
                capacity: DeviceCapacity {
                    memory_mib: scale(d.memory_mib, settings.device_memory_scaling),
                    cores: u32::try_from(scale(100, settings.device_core_scaling))
                        .unwrap_or(u32::MAX),
                },
                split_count: settings.device_split_count,
                numa_node: d.numa_node,
                nvlink_peers: d.nvlink_peers.clone(),
                compute_capability: d.compute_capability.clone(),
                driver_version: d.driver_version.clone(),
                health: d.health,
                health_message: d.health_message.clone(),
                mode: settings.operating_mode,
                mig_instances: Vec::new(),
                mig: None,
                profiles: Vec::new(),
                minor: None,
                qos_policy: None,
            };
            offering.offer(whole, d.mig.as_ref(), settings, holders)
        })
        .collect()
}

/// `value × factor`, rounded down (a slice never promises more than exists × factor).
fn scale(value: u64, factor: f64) -> u64 {
    (value as f64 * factor).floor() as u64
}

#[cfg(test)]
mod tests {
    use tessera_api::v1alpha1::{
        DeviceHealth, FilterDevices, MigInstance, MigStrategy, OperatingMode,
    };

    use super::*;
    use crate::backend::PhysicalMig;

    fn gpu(index: u32) -> PhysicalGpu {
        PhysicalGpu {
            uuid: format!("GPU-{index}"),
            index,
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81_920,
            numa_node: Some(index / 2),
            nvlink_peers: Vec::new(),
            compute_capability: None,
            driver_version: None,
            health: DeviceHealth::Healthy,
            health_message: None,
            mig: None,
        }
    }

    #[test]
    fn defaults_offer_every_gpu_unscaled() {
        let offered = offered(
            &[gpu(0), gpu(1)],
            &NodeSettings::default(),
            &MigHolders::new(),
        );
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
        let offered = offered(
            &[gpu(0), gpu(1), gpu(2), gpu(3)],
            &settings,
            &MigHolders::new(),
        );
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

    fn mig_gpu(index: u32, enabled: bool, profiles: &[&str]) -> PhysicalGpu {
        let layout = tessera_api::mig::layout_for_model("NVIDIA A100-SXM4-80GB").unwrap();
        let instances = profiles
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let p = layout.profiles.iter().find(|p| p.name == *name).unwrap();
                MigInstance {
                    profile: p.name.clone(),
                    uuid: format!("MIG-{index}-{i}"),
                    memory_mib: p.memory_mib,
                    placement: tessera_api::v1alpha1::MigPlacement {
                        start: p.placements[i],
                        size: p.memory_slices,
                    },
                    held_by: None,
                }
            })
            .collect();
        PhysicalGpu {
            mig: Some(PhysicalMig {
                enabled,
                layout,
                instances,
            }),
            ..gpu(index)
        }
    }

    fn mig_settings(strategy: MigStrategy) -> NodeSettings {
        NodeSettings {
            operating_mode: OperatingMode::Mig,
            mig_strategy: strategy,
            ..NodeSettings::default()
        }
    }

    #[test]
    fn dynamic_mig_offers_the_layout_and_the_instances_with_their_holders() {
        let physical = [mig_gpu(0, true, &["1g.10gb"])];
        let holders = MigHolders::from([(
            (
                "GPU-0".to_owned(),
                tessera_api::v1alpha1::MigPlacement { start: 0, size: 1 },
            ),
            "ml/train".to_owned(),
        )]);
        let offered = offered(&physical, &mig_settings(MigStrategy::None), &holders);
        assert_eq!(offered.len(), 1);
        assert_eq!(offered[0].mode, OperatingMode::Mig);
        assert_eq!(offered[0].mig.as_ref().unwrap().profiles.len(), 7);
        assert_eq!(
            offered[0].mig_instances[0].held_by.as_deref(),
            Some("ml/train")
        );
        assert_eq!(offered[0].health, DeviceHealth::Healthy);
    }

    #[test]
    fn mig_profiles_narrow_what_dynamic_mig_may_create() {
        let physical = [mig_gpu(0, true, &[])];
        let mut settings = mig_settings(MigStrategy::None);
        settings.mig_profiles = vec!["1g.10gb".into(), "3g.40gb".into(), "9g.90gb".into()];
        let offered_now = offered(&physical, &settings, &MigHolders::new());
        let names: Vec<&str> = offered_now[0]
            .mig
            .as_ref()
            .unwrap()
            .profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["1g.10gb", "3g.40gb"]);
        settings.mig_profiles = vec!["1g.5gb".into()];
        let none = offered(&physical, &settings, &MigHolders::new());
        assert_eq!(none[0].health, DeviceHealth::Unhealthy);
        let message = none[0].health_message.as_deref().unwrap();
        assert!(message.contains("migProfiles allows 1g.5gb"), "{message}");
    }

    #[test]
    fn single_offers_each_instance_whole_and_mixed_offers_no_slice() {
        let physical = [mig_gpu(0, true, &["3g.40gb", "3g.40gb"])];
        let single = offered(
            &physical,
            &mig_settings(MigStrategy::Single),
            &MigHolders::new(),
        );
        let uuids: Vec<&str> = single.iter().map(|d| d.uuid.as_str()).collect();
        assert_eq!(uuids, ["MIG-0-0", "MIG-0-1"]);
        assert_eq!(single[0].split_count, 1);
        assert_eq!(single[0].capacity.memory_mib, 40192);
        assert_eq!(single[0].model, "NVIDIA A100-SXM4-80GB MIG 3g.40gb");
        let mixed = offered(
            &physical,
            &mig_settings(MigStrategy::Mixed),
            &MigHolders::new(),
        );
        assert_eq!(mixed.len(), 1);
        assert_eq!(mixed[0].split_count, 0);
        assert_eq!(mixed[0].mig_instances.len(), 2);
        let uneven = [mig_gpu(0, true, &["1g.10gb", "2g.20gb"])];
        let single = offered(
            &uneven,
            &mig_settings(MigStrategy::Single),
            &MigHolders::new(),
        );
        assert_eq!(single[0].health, DeviceHealth::Unhealthy);
        assert!(
            single[0]
                .health_message
                .as_deref()
                .unwrap()
                .contains("found 1g.10gb, 2g.20gb; use migStrategy: mixed")
        );
    }

    #[test]
    fn a_gpu_that_cannot_do_the_mode_is_unhealthy_with_the_fix() {
        let message = |gpu: PhysicalGpu, settings: &NodeSettings| {
            let offered = offered(&[gpu], settings, &MigHolders::new());
            assert_eq!(offered[0].health, DeviceHealth::Unhealthy);
            offered[0].health_message.clone().unwrap()
        };
        let dynamic = mig_settings(MigStrategy::None);
        assert!(message(gpu(0), &dynamic).contains("knows no MIG layout"));
        assert!(message(mig_gpu(0, false, &[]), &dynamic).contains("nvidia-smi -i 0 -mig 1"));
        assert!(
            message(mig_gpu(0, true, &[]), &NodeSettings::default())
                .contains("operatingMode is hami-core")
        );
        // MIG-capable but off, in hami-core: a plain GPU.
        let plain = offered(
            &[mig_gpu(0, false, &[])],
            &NodeSettings::default(),
            &MigHolders::new(),
        );
        assert_eq!(plain[0].health, DeviceHealth::Healthy);
    }
}
