//! What the agent publishes as the node's ResourceSlice. Pure: no I/O.
//!
//! One device per GPU the node offers in hami-core mode, shareable
//! (`allowMultipleAllocations`, DRA consumable capacity) with two capacities
//! a claim consumes part of:
//! - `memory`: the GPU's offered memory; a claim names how much (`8Gi`), at
//!   least 1 MiB, in whole MiB; a claim that names none takes all of it (the
//!   policy's default), as a HAMi pod without `nvidia.com/gpumem` takes the
//!   whole GPU's memory;
//! - `cores`: percent of the SMs, 0 to 100 in steps of 1; a claim that names
//!   none consumes 0 (no limit, shared), as HAMi's `gpucores` default;
//! - `slices`: the GPU's `deviceSplitCount`; every claim consumes exactly 1,
//!   so no more claims share a GPU than HAMi-style pods could.
//!
//! Attributes a claim may select on with CEL or constrain with
//! `matchAttribute`: `uuid`, `model`, `index`, and when known `numaNode`,
//! `cudaComputeCapability` and `driverVersion` (versions, so CEL can compare
//! them: `device.attributes["gpu.tessera.dev"].cudaComputeCapability.compareTo(semver("8.9.0")) >= 0`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::resource::v1::{
        CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
        ResourcePool, ResourceSlice, ResourceSliceSpec,
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use tessera_api::v1alpha1::{DeviceHealth, GpuDevice};

use crate::{offer::Offer, sharing::Mode};

use tessera_api::names::dra::DRIVER;

/// The GPUs of `offer` the DRA door publishes: the healthy ones, on a
/// node whose sharing mode goes through DRA (hami-core); none otherwise.
pub fn published_devices(offer: &Offer) -> Vec<GpuDevice> {
    if !Mode::of(&offer.resolved.settings).through_dra() {
        return Vec::new();
    }
    offer
        .devices
        .iter()
        .filter(|d| d.health == DeviceHealth::Healthy && d.cordoned_by.is_none())
        .cloned()
        .collect()
}

/// The node's ResourceSlice for `devices` ([`published_devices`]), in pool
/// `node` (one pool per node, one slice per pool) at `generation`.
pub fn resource_slice(node: &str, generation: i64, devices: &[GpuDevice]) -> ResourceSlice {
    let devices = devices.iter().map(device).collect();
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node}-{DRIVER}")),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool {
                name: node.to_owned(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
}

fn device(gpu: &GpuDevice) -> Device {
    let string = |value: &str| DeviceAttribute {
        string: Some(value.to_owned()),
        ..DeviceAttribute::default()
    };
    let int = |value: u32| DeviceAttribute {
        int: Some(i64::from(value)),
        ..DeviceAttribute::default()
    };
    let mut attributes = BTreeMap::from([
        ("uuid".to_owned(), string(&gpu.uuid)),
        ("model".to_owned(), string(&gpu.model)),
        ("index".to_owned(), int(gpu.index)),
    ]);
    if let Some(numa) = gpu.numa_node {
        attributes.insert("numaNode".to_owned(), int(numa));
    }
    let version = |value: Option<&String>| {
        value.and_then(|v| semver(v)).map(|v| DeviceAttribute {
            version: Some(v),
            ..DeviceAttribute::default()
        })
    };
    if let Some(capability) = version(gpu.compute_capability.as_ref()) {
        attributes.insert("cudaComputeCapability".to_owned(), capability);
    }
    if let Some(driver) = version(gpu.driver_version.as_ref()) {
        attributes.insert("driverVersion".to_owned(), driver);
    }
    let memory = Quantity(format!("{}Mi", gpu.capacity.memory_mib));
    let capacity = BTreeMap::from([
        (
            "memory".to_owned(),
            DeviceCapacity {
                value: memory.clone(),
                request_policy: Some(CapacityRequestPolicy {
                    // The API server requires a default beside a valid range.
                    default: Some(memory),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: Quantity("1Mi".to_owned()),
                        max: None,
                        step: Some(Quantity("1Mi".to_owned())),
                    }),
                    valid_values: None,
                }),
            },
        ),
        (
            "slices".to_owned(),
            DeviceCapacity {
                value: Quantity(gpu.split_count.to_string()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(Quantity("1".to_owned())),
                    valid_range: None,
                    valid_values: Some(vec![Quantity("1".to_owned())]),
                }),
            },
        ),
        (
            "cores".to_owned(),
            DeviceCapacity {
                value: Quantity(gpu.capacity.cores.to_string()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(Quantity("0".to_owned())),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: Quantity("0".to_owned()),
                        max: Some(Quantity("100".to_owned())),
                        step: Some(Quantity("1".to_owned())),
                    }),
                    valid_values: None,
                }),
            },
        ),
    ]);
    Device {
        name: device_name(gpu.index),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Device::default()
    }
}

/// `text` (`9.0`, `535.104.05`) as a semantic version's core
/// (`9.0.0`, `535.104.5`), which DRA's `version` attributes must be; `None`
/// when it is not one to three numbers.
fn semver(text: &str) -> Option<String> {
    let numbers: Vec<u64> = text
        .split('.')
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    if numbers.is_empty() || numbers.len() > 3 {
        return None;
    }
    let at = |i: usize| numbers.get(i).copied().unwrap_or(0);
    Some(format!("{}.{}.{}", at(0), at(1), at(2)))
}

/// The device name of GPU `index` in the node's pool (a DNS label).
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

#[cfg(test)]
mod tests {
    use tessera_api::{testing::gpu, v1alpha1::OperatingMode};

    use super::*;

    fn offer(mode: OperatingMode, devices: Vec<GpuDevice>) -> Offer {
        let settings = tessera_api::v1alpha1::NodeSettings {
            operating_mode: mode,
            ..Default::default()
        };
        Offer {
            resolved: tessera_api::node_config::resolve(
                "node-a",
                &Default::default(),
                &settings,
                &[],
            ),
            devices,
        }
    }

    #[test]
    fn each_healthy_hami_core_gpu_is_one_shareable_device() {
        let mut sick = gpu(2, "NVIDIA H100 80GB HBM3", 81559);
        sick.health = DeviceHealth::Unhealthy;
        let mut near = gpu(1, "NVIDIA H100 80GB HBM3", 81559);
        near.numa_node = Some(1);
        near.compute_capability = Some("9.0".into());
        near.driver_version = Some("535.104.05".into());
        let devices = vec![gpu(0, "NVIDIA H100 80GB HBM3", 81559), near, sick];
        // MPS and MIG nodes publish nothing: DRA serves hami-core slices.
        for mode in [OperatingMode::Mps, OperatingMode::Mig] {
            assert!(published_devices(&offer(mode, devices.clone())).is_empty());
        }
        let published = published_devices(&offer(OperatingMode::HamiCore, devices));
        let slice = resource_slice("node-a", 7, &published);
        assert_eq!(slice.spec.driver, "gpu.tessera.dev");
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice.spec.pool.generation, 7);
        let devices = slice.spec.devices.unwrap();
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1"]);
        let one = &devices[1];
        assert_eq!(one.allow_multiple_allocations, Some(true));
        let attributes = one.attributes.as_ref().unwrap();
        assert_eq!(attributes["uuid"].string.as_deref(), Some("GPU-1"));
        assert_eq!(attributes["numaNode"].int, Some(1));
        assert_eq!(
            attributes["cudaComputeCapability"].version.as_deref(),
            Some("9.0.0")
        );
        assert_eq!(
            attributes["driverVersion"].version.as_deref(),
            Some("535.104.5"),
            "a semantic version, without the leading zero"
        );
        assert!(
            !devices[0]
                .attributes
                .as_ref()
                .unwrap()
                .contains_key("numaNode")
        );
        let capacity = one.capacity.as_ref().unwrap();
        assert_eq!(capacity["memory"].value.0, "81559Mi");
        assert_eq!(capacity["cores"].value.0, "100");
        assert_eq!(capacity["slices"].value.0, "10", "the split count");
        let slices = capacity["slices"].request_policy.as_ref().unwrap();
        assert_eq!(slices.valid_values.as_ref().unwrap()[0].0, "1");
        let cores = capacity["cores"].request_policy.as_ref().unwrap();
        assert_eq!(cores.default.as_ref().unwrap().0, "0");
        let memory = capacity["memory"].request_policy.as_ref().unwrap();
        assert_eq!(
            memory.default.as_ref().unwrap().0,
            "81559Mi",
            "the whole GPU's memory"
        );
    }

    #[test]
    fn versions_become_semantic_versions_or_nothing() {
        assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(semver("550.54.15").as_deref(), Some("550.54.15"));
        assert_eq!(semver("12").as_deref(), Some("12.0.0"));
        for bad in ["", "9.x", "1.2.3.4", "-1.0"] {
            assert_eq!(semver(bad), None, "{bad}");
        }
    }
}
