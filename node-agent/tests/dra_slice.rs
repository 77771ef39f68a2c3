//! The node's DRA ResourceSlice (`dra::resource_slice`) on a real
//! kube-apiserver v1.36: accepted by `resource.k8s.io/v1`'s validation, and
//! its consumable-capacity fields (`allowMultipleAllocations`, request
//! policies) kept, which an API server without DRA consumable capacity
//! silently drops.

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{Api, api::PostParams};
use tessera_api::testing::gpu;
use tessera_node_agent::dra;

#[tokio::test]
async fn the_node_slice_is_valid_and_keeps_its_consumable_capacity() {
    let plane = tessera_e2e::shared().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(plane.client().await.unwrap());
    let mut near = gpu(1, "NVIDIA H100 80GB HBM3", 81559);
    near.numa_node = Some(1);
    near.compute_capability = Some("9.0".into());
    near.driver_version = Some("550.54.15".into());
    let slice = dra::resource_slice(
        "dra-node",
        1,
        &[gpu(0, "NVIDIA H100 80GB HBM3", 81559), near],
    );
    let stored = slices
        .create(&PostParams::default(), &slice)
        .await
        .expect("the API server accepts the slice");
    assert_eq!(
        stored.spec.devices, slice.spec.devices,
        "nothing dropped or changed"
    );
    let device = &stored.spec.devices.unwrap()[1];
    assert_eq!(device.allow_multiple_allocations, Some(true));
    assert!(
        device.capacity.as_ref().unwrap()["memory"]
            .request_policy
            .is_some()
    );
}
