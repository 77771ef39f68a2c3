use std::collections::BTreeMap;

use k8s_openapi::{
    api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
        ResourceClaimStatus,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use pretty_assertions::assert_eq;
use tessera_api::testing::gpu;

use super::*;

fn result(device: &str, pool: &str, consumed: &[(&str, &str)]) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        driver: DRIVER.into(),
        pool: pool.into(),
        device: device.into(),
        request: "gpu".into(),
        consumed_capacity: (!consumed.is_empty()).then(|| {
            consumed
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect::<BTreeMap<_, _>>()
        }),
        ..DeviceRequestAllocationResult::default()
    }
}

fn claim(results: Vec<DeviceRequestAllocationResult>) -> ResourceClaim {
    let mut claim = ResourceClaim::default();
    claim.metadata.namespace = Some("ml".into());
    claim.metadata.name = Some("train-gpu".into());
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                ..DeviceAllocationResult::default()
            }),
            ..AllocationResult::default()
        }),
        ..ResourceClaimStatus::default()
    });
    claim
}

fn offer() -> Vec<GpuDevice> {
    vec![
        gpu(0, "NVIDIA H100 80GB HBM3", 81559),
        gpu(1, "NVIDIA H100 80GB HBM3", 81559),
    ]
}

#[test]
fn a_claim_holds_the_capacity_it_consumed_of_each_device() {
    let claim = claim(vec![
        result("gpu-1", "node-a", &[("memory", "8Gi"), ("cores", "30")]),
        result("gpu-0", "node-a", &[]),
        // Another driver's device, or another node's: not ours.
        DeviceRequestAllocationResult {
            driver: "gpu.nvidia.com".into(),
            ..result("gpu-0", "node-a", &[])
        },
        result("gpu-0", "node-b", &[]),
    ]);
    let gpus = claim_gpus(&claim, "node-a", &offer()).unwrap();
    assert_eq!(
        gpus,
        [
            ClaimGpu {
                uuid: "GPU-1".into(),
                memory_mib: 8192,
                cores: 30
            },
            ClaimGpu {
                uuid: "GPU-0".into(),
                memory_mib: 81559,
                cores: 0
            },
        ]
    );
}

#[test]
fn a_claim_that_cannot_be_served_says_why() {
    let error = |claim: ResourceClaim| {
        claim_gpus(&claim, "node-a", &offer())
            .unwrap_err()
            .to_string()
    };
    let mut unallocated = claim(Vec::new());
    unallocated.status = None;
    assert!(error(unallocated).contains("ml/train-gpu: is not allocated"));
    assert!(error(claim(vec![result("gpu-7", "node-a", &[])])).contains("device gpu-7"));
    assert!(
        error(claim(vec![result(
            "gpu-0",
            "node-a",
            &[("memory", "1000")]
        )]))
        .contains("consumedCapacity.memory of gpu-0")
    );
    assert!(
        error(claim(vec![result("gpu-0", "node-a", &[("cores", "130")])]))
            .contains("is not 0 to 100")
    );
    assert!(error(claim(vec![result("gpu-0", "node-b", &[])])).contains("no device of driver"));
}

#[test]
fn the_cdi_device_gives_what_allocate_gives() {
    let gpus = [
        ClaimGpu {
            uuid: "GPU-1".into(),
            memory_mib: 8192,
            cores: 30,
        },
        ClaimGpu {
            uuid: "GPU-0".into(),
            memory_mib: 4096,
            cores: 10,
        },
    ];
    let paths = HostPaths {
        library: "/usr/local/vgpu/libtessera_vgpu.so".into(),
        preload: "/var/lib/tessera/ld.so.preload".into(),
        regions: "/var/lib/tessera/containers".into(),
    };
    let spec = cdi_spec(
        "uid-1",
        &gpus,
        &NodeSettings::default(),
        &paths,
        Path::new("/var/lib/tessera/claims/uid-1"),
    );
    assert_eq!(spec["kind"], "tessera.dev/vgpu");
    let device = &spec["devices"][0];
    assert_eq!(device["name"], "uid-1");
    let env: Vec<&str> = device["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for wanted in [
        "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-0",
        "CUDA_DEVICE_MEMORY_LIMIT_0=8192m",
        "CUDA_DEVICE_MEMORY_LIMIT_1=4096m",
        "CUDA_DEVICE_SM_LIMIT=30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/run/tessera/vgpu/region",
    ] {
        assert!(env.contains(&wanted), "{wanted} not in {env:?}");
    }
    let mounts = device["containerEdits"]["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 3);
    assert_eq!(mounts[2]["hostPath"], "/var/lib/tessera/claims/uid-1");
    assert_eq!(mounts[2]["options"][0], "rw");
    assert_eq!(mounts[0]["options"][0], "ro");
}
