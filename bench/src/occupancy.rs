//! Background occupancy: about one allocation per GPU before a run starts,
//! as a cluster that has been busy for a while holds. Each is a pod bound to
//! its node (kwok makes it Running) and the VgpuAllocation Bind would have
//! written for it, already `Allocated` as the agent leaves it. Written
//! before tessera-controller starts, so its start-up lists them all.

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_api::{
    testing::{allocation, container},
    v1alpha1::{AllocationPhase, DeviceSlice, VgpuAllocation},
};

use crate::{
    Error,
    fleet::{self, Shape},
    pods::{self, CONCURRENCY, GpuAsk, NAMESPACE},
};

/// What each background pod holds on its GPU.
pub const ASK: GpuAsk = GpuAsk {
    memory_mib: 8192,
    cores: 10,
};
/// The role label of background pods.
pub const ROLE: &str = "background";

/// Writes one background pod and allocation per GPU of every node.
pub async fn fill(client: &Client, shape: Shape) -> Result<usize, Error> {
    let items = (0..shape.nodes).flat_map(|n| (0..shape.gpus).map(move |g| (n, g)));
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let allocations: Api<VgpuAllocation> = Api::namespaced(client.clone(), NAMESPACE);
    let count = stream::iter(items)
        .map(|(n, g)| {
            let (pods_api, allocations) = (pods_api.clone(), allocations.clone());
            async move { one(&pods_api, &allocations, n, g).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_fold(0, |count, ()| async move { Ok(count + 1) })
        .await?;
    Ok(count)
}

/// Whether some pod of the namespace is still Pending (kwok has not made
/// it Running yet).
pub async fn any_pending(client: &Client) -> Result<bool, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pending = kube::api::ListParams::default()
        .fields("status.phase=Pending")
        .limit(1);
    let list = api
        .list(&pending)
        .await
        .map_err(Error::kube("listing pending pods"))?;
    Ok(!list.items.is_empty())
}

async fn one(
    pods_api: &Api<Pod>,
    allocations: &Api<VgpuAllocation>,
    n: usize,
    g: u32,
) -> Result<(), Error> {
    let node = fleet::node_name(n);
    let name = format!("bg-{n:05}-{g}");
    let mut pod = pods::pod(&name, ROLE, Some(ASK));
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.clone());
        spec.scheduler_name = Some(tessera_e2e::stack::SCHEDULER_NAME.to_owned());
    }
    let pod = pods::create(pods_api, &pod).await?;
    let slice = DeviceSlice {
        mutex: false,
        family: Default::default(),
        template: None,
        uuid: fleet::gpu_uuid(n, g),
        index: g,
        model: fleet::MODEL.to_owned(),
        memory_mib: ASK.memory_mib,
        cores: ASK.cores,
        mig: None,
        core_indexes: Vec::new(),
        sharing: None,
    };
    let object = allocation(&name, &pod.uid().unwrap_or_default(), &node)
        .namespace(NAMESPACE)
        .container(container("main", vec![slice]))
        .build();
    match allocations.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => return Err(Error::kube(format!("creating allocation {name}"))(e)),
    }
    let status =
        json!({"status": {"phase": AllocationPhase::Allocated, "servedContainers": ["main"]}});
    allocations
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map_err(Error::kube(format!("marking allocation {name} Allocated")))?;
    Ok(())
}
