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
    let held: Vec<(&str, &str, u64, u32)> = gpus
        .iter()
        .map(|g| (g.device.as_str(), g.uuid.as_str(), g.memory_mib, g.cores))
        .collect();
    assert_eq!(
        held,
        [("gpu-1", "GPU-1", 8192, 30), ("gpu-0", "GPU-0", 81559, 0)]
    );
    assert!(
        gpus.iter()
            .all(|g| g.request == "gpu" && g.model.contains("H100"))
    );
}

#[test]
fn a_subrequest_serves_its_parent_request() {
    let claim = claim(vec![DeviceRequestAllocationResult {
        request: "gpu/small".into(),
        share_id: Some("share-1".into()),
        ..result("gpu-0", "node-a", &[("memory", "2Gi")])
    }]);
    let gpus = claim_gpus(&claim, "node-a", &offer()).unwrap();
    assert_eq!(gpus[0].request, "gpu");
    assert_eq!(gpus[0].share_id.as_deref(), Some("share-1"));
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

/// An H100 `GPU-<index>` share of `request` (the mirror's tests use it too).
pub(crate) fn claimed(request: &str, index: u32, memory_mib: u64, cores: u32) -> ClaimGpu {
    ClaimGpu {
        request: request.into(),
        device: format!("gpu-{index}"),
        uuid: format!("GPU-{index}"),
        index,
        model: "NVIDIA H100 80GB HBM3".into(),
        memory_mib,
        cores,
        share_id: None,
    }
}

fn env_of(device: &serde_json::Value) -> Vec<&str> {
    device["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect()
}

#[test]
fn each_request_gets_a_cdi_device_that_gives_what_allocate_gives() {
    let gpus = [
        claimed("gpu", 1, 8192, 30),
        claimed("gpu", 0, 4096, 10),
        claimed("other", 0, 2048, 0),
    ];
    let paths = HostPaths {
        library: "/usr/local/vgpu/libtessera_vgpu.so".into(),
        preload: "/var/lib/tessera/ld.so.preload".into(),
        regions: "/var/lib/tessera/containers".into(),
        limits: "/var/lib/tessera/limits".into(),
    };
    let spec = cdi_spec("uid-1", &gpus, &NodeSettings::default(), &paths);
    assert_eq!(spec["kind"], "tessera.dev/vgpu");
    let device = &spec["devices"][0];
    assert_eq!(device["name"], "uid-1-gpu");
    let env = env_of(device);
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
    assert_eq!(mounts.len(), 4);
    assert_eq!(
        mounts[2]["hostPath"],
        "/var/lib/tessera/containers/uid-1_gpu"
    );
    assert_eq!(mounts[2]["options"][0], "rw");
    assert_eq!(mounts[0]["options"][0], "ro");
    // The limits file's directory, read-only.
    assert_eq!(mounts[3]["hostPath"], "/var/lib/tessera/limits/uid-1_gpu");
    assert_eq!(mounts[3]["containerPath"], "/var/run/tessera/limits");
    assert_eq!(mounts[3]["options"][0], "ro");

    let other = &spec["devices"][1];
    assert_eq!(other["name"], "uid-1-other");
    let env = env_of(other);
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-0"), "{env:?}");
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=2048m"), "{env:?}");
    assert!(
        !env.iter()
            .any(|e| e.starts_with("CUDA_DEVICE_MEMORY_LIMIT_1"))
    );
}

#[test]
fn two_shares_of_one_gpu_in_a_request_are_one_gpu_with_their_sum() {
    let gpus = [claimed("gpu", 1, 4096, 20), claimed("gpu", 1, 2048, 10)];
    let paths = HostPaths {
        library: "/l.so".into(),
        preload: "/p".into(),
        regions: "/r".into(),
        limits: "/l".into(),
    };
    let spec = cdi_spec("uid-1", &gpus, &NodeSettings::default(), &paths);
    let env = env_of(&spec["devices"][0]);
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-1"), "{env:?}");
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=6144m"), "{env:?}");
    assert!(env.contains(&"CUDA_DEVICE_SM_LIMIT=30"), "{env:?}");
    assert!(
        !env.iter()
            .any(|e| e.starts_with("CUDA_DEVICE_MEMORY_LIMIT_1"))
    );
}

#[test]
fn the_kubelet_gets_each_requests_cdi_device_once() {
    let gpus = [
        claimed("gpu", 1, 8192, 30),
        claimed("gpu", 0, 4096, 10),
        claimed("other", 0, 2048, 0),
    ];
    let devices = prepared_devices("uid-1", "node-a", &gpus);
    let ids: Vec<(&str, &str, Vec<&str>)> = devices
        .iter()
        .map(|d| {
            (
                d.request_names[0].as_str(),
                d.device_name.as_str(),
                d.cdi_device_ids.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        ids,
        [
            ("gpu", "gpu-1", vec!["tessera.dev/vgpu=uid-1-gpu"]),
            ("gpu", "gpu-0", vec![]),
            ("other", "gpu-0", vec!["tessera.dev/vgpu=uid-1-other"]),
        ]
    );
    assert!(devices.iter().all(|d| d.pool_name == "node-a"));
}
