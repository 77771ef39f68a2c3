//! Device quotas: what pods count (HAMi's `countPodDevices` and
//! `CollapseInitContainerUsage`, with sidecars as the kubelet counts them)
//! and HAMi's `TestFitQuota` cases.

use crate::request::parse_pod;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::quota::{Charge, Limit, Limits, OverQuota, accumulate, charge, check, least_charge};
use super::vendor_tests::{FREE, Row, config, node};
use super::*;

fn limits(entries: &[(&str, u64)]) -> Limits {
    entries
        .iter()
        .map(|(name, hard)| {
            (
                (*name).to_owned(),
                Limit {
                    quota: "q".into(),
                    hard: *hard,
                    unit: 1,
                },
            )
        })
        .collect()
}

fn amounts(entries: &[(&str, u64)]) -> Charge {
    entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

const MEM: &str = "nvidia.com/gpumem";
const CORES: &str = "nvidia.com/gpucores";

#[test]
fn fits_as_hamis_fit_quota() {
    // TestFitQuota / TestFitQuotaExplicitZeroBlocks: used + asked against
    // the limit; no limit set means no limit; an explicit 0 blocks.
    let quota = limits(&[(MEM, 2000), (CORES, 200)]);
    assert!(check(&quota, &amounts(&[(MEM, 1000)]), &amounts(&[(MEM, 1000)])).is_ok());
    let over = check(&quota, &amounts(&[(MEM, 1500)]), &amounts(&[(MEM, 1000)])).unwrap_err();
    assert_eq!(
        over,
        OverQuota {
            resource: MEM.into(),
            limit: quota[MEM].clone(),
            used: 1500,
            asked: 1000
        }
    );
    assert_eq!(
        over.to_string(),
        "ResourceQuota \"q\" allows limits.nvidia.com/gpumem: 2000; the namespace's pods hold 1500, this pod would add 1000"
    );
    assert!(check(&quota, &amounts(&[(CORES, 150)]), &amounts(&[(CORES, 60)])).is_err());
    assert!(
        check(
            &limits(&[]),
            &amounts(&[(MEM, 1 << 40)]),
            &amounts(&[(MEM, 1)])
        )
        .is_ok()
    );
    let zero = limits(&[(MEM, 0)]);
    assert!(check(&zero, &Charge::new(), &amounts(&[(MEM, 1)])).is_err());
    assert!(
        check(&zero, &Charge::new(), &amounts(&[(CORES, 10)])).is_ok(),
        "cores are not limited there"
    );
    // A memory unit above 1 MiB: 2 units of 512 MiB allow 1024 MiB.
    let mut units = limits(&[("mthreads.com/sgpu-memory", 2)]);
    units.get_mut("mthreads.com/sgpu-memory").unwrap().unit = 512;
    let asked = amounts(&[("mthreads.com/sgpu-memory", 1024)]);
    assert!(check(&units, &Charge::new(), &asked).is_ok());
    let over = check(&units, &amounts(&[("mthreads.com/sgpu-memory", 1)]), &asked).unwrap_err();
    assert!(
        over.to_string()
            .ends_with("allows limits.mthreads.com/sgpu-memory: 2 (512 MiB each); the namespace's pods hold 1, this pod would add 2"),
        "{over}"
    );
}

#[test]
fn usage_adds_and_removes_without_going_below_zero() {
    // TestAddUsageAndRmUsage.
    let mut used = Charge::new();
    accumulate(&mut used, &amounts(&[(MEM, 1000), (CORES, 30)]), true);
    accumulate(&mut used, &amounts(&[(MEM, 500)]), true);
    assert_eq!(used, amounts(&[(MEM, 1500), (CORES, 30)]));
    accumulate(&mut used, &amounts(&[(MEM, 2000), (CORES, 30)]), false);
    assert!(used.is_empty(), "clamped at zero and dropped");
}

fn pod(spec: serde_json::Value) -> crate::request::PodRequest {
    let pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap();
    parse_pod(&pod, &config()).unwrap().unwrap()
}

fn gpus(n: usize, total_mem: u64) -> NodeGpus {
    let rows: Vec<Row> = ["dev-0", "dev-1", "dev-2", "dev-3"][..n]
        .iter()
        .map(|id| Row {
            id,
            count: 10,
            total_mem,
            ..FREE
        })
        .collect();
    node(tessera_api::v1alpha1::DeviceFamily::Nvidia, "A100", &rows)
}

fn placed_charge(node: &NodeGpus, request: &crate::request::PodRequest) -> Charge {
    let placement = fit(
        node,
        request,
        tessera_api::v1alpha1::SchedulingPolicy::Spread,
    )
    .unwrap();
    let config = config();
    charge(request, &placement, &quota::names(request, &config))
}

#[test]
fn a_pod_counts_what_it_is_given() {
    // Percentages resolve on the device, every GPU of a container counts.
    let node = gpus(2, 40000);
    let half = pod(
        json!({"containers": [{"name": "c", "resources": {"limits": {
        "nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"}}}]}),
    );
    assert_eq!(
        placed_charge(&node, &half),
        amounts(&[(MEM, 40000), (CORES, 60)])
    );
    assert_eq!(
        least_charge(&half, &quota::names(&half, &config())),
        amounts(&[(CORES, 60)]),
        "before placement a percentage counts nothing"
    );
    // No memory named: the whole device (HAMi's default), cores 100.
    let whole = pod(
        json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
    );
    assert_eq!(
        placed_charge(&node, &whole),
        amounts(&[(MEM, 40000), (CORES, 100)])
    );
    // Another family's names.
    let dcu = pod(
        json!({"containers": [{"name": "c", "resources": {"limits": {
        "hygon.com/dcunum": "1", "hygon.com/dcumem": "64", "hygon.com/dcucores": "50"}}}]}),
    );
    let dcus = super::vendor_tests::node(
        tessera_api::v1alpha1::DeviceFamily::Hygon,
        "DCU",
        &[Row {
            total_mem: 128,
            ..FREE
        }],
    );
    assert_eq!(
        placed_charge(&dcus, &dcu),
        amounts(&[("hygon.com/dcucores", 50), ("hygon.com/dcumem", 64)])
    );
}

/// Review finding M5: an NVIDIA slice of 0 cores runs with no compute
/// limit, so it counts its device's cores (100 × core scaling), and a
/// namespace's cores quota holds against pods that name no cores.
#[test]
fn a_slice_of_no_cores_counts_its_device_s_cores() {
    let mut node = gpus(2, 40000);
    let no_cores = pod(
        json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}]}),
    );
    assert_eq!(no_cores.containers[0].cores, 0, "defaultCores: 0");
    assert_eq!(
        placed_charge(&node, &no_cores),
        amounts(&[(MEM, 1000), (CORES, 100)])
    );
    // Two vGPUs of none: each device's cores.
    let two = pod(
        json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "0"}}}]}),
    );
    assert_eq!(
        placed_charge(&node, &two),
        amounts(&[(MEM, 2000), (CORES, 200)])
    );
    // A core scaling of 2: the device's 200 cores.
    for device in &mut node.devices {
        device.cores = 200;
    }
    assert_eq!(
        placed_charge(&node, &no_cores),
        amounts(&[(MEM, 1000), (CORES, 200)])
    );
    // Cores named: as asked.
    let thirty = pod(
        json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "30"}}}]}),
    );
    assert_eq!(
        placed_charge(&node, &thirty),
        amounts(&[(MEM, 1000), (CORES, 30)])
    );
    // Before placement the device is not known: 0 is the only floor.
    assert_eq!(
        least_charge(&no_cores, &quota::names(&no_cores, &config())),
        amounts(&[(MEM, 1000)])
    );
    // The most it can count on the node bounds it still.
    let most = quota::most_charge(&no_cores, &node, &quota::names(&no_cores, &config()));
    assert_eq!(most[CORES], 200);

    // With limits.nvidia.com/gpucores: 100 on 100-core GPUs, the first
    // such pod fits and the second does not.
    let node = gpus(2, 40000);
    let quota = limits(&[(CORES, 100)]);
    let first = placed_charge(&node, &no_cores);
    assert!(check(&quota, &Charge::new(), &first).is_ok());
    let over = check(&quota, &first, &placed_charge(&node, &no_cores)).unwrap_err();
    assert_eq!((over.used, over.asked), (100, 100));
}

#[test]
fn the_most_a_pod_can_count_bounds_what_it_counts() {
    let node = gpus(2, 40000);
    for limits in [
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}),
        json!({"nvidia.com/gpu": "1"}),
    ] {
        let request = pod(json!({"containers": [{"name": "c", "resources": {"limits": limits}}]}));
        let most = quota::most_charge(&request, &node, &quota::names(&request, &config()));
        for (name, amount) in placed_charge(&node, &request) {
            assert!(amount <= most[&name], "{name}: {amount} > {}", most[&name]);
        }
    }
    let two = pod(
        json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}),
    );
    assert_eq!(
        quota::most_charge(&two, &node, &quota::names(&two, &config())),
        amounts(&[(MEM, 80000), (CORES, 200)])
    );
}

#[test]
fn init_containers_count_as_the_kubelet_counts_them() {
    let node = gpus(4, 40000);
    let mib = |m: u64| json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": m.to_string(), "nvidia.com/gpucores": "10"});
    // An init container larger than the app containers sets the pod's
    // figure; it does not add to them.
    let big_init = pod(json!({
        "initContainers": [{"name": "warm", "resources": {"limits": mib(8000)}}],
        "containers": [
            {"name": "a", "resources": {"limits": mib(1000)}},
            {"name": "b", "resources": {"limits": mib(2000)}},
        ],
    }));
    assert_eq!(
        placed_charge(&node, &big_init),
        amounts(&[(MEM, 8000), (CORES, 20)])
    );
    assert_eq!(
        least_charge(&big_init, &quota::names(&big_init, &config())),
        amounts(&[(MEM, 8000), (CORES, 20)])
    );
    // A sidecar runs beside everything after it: it adds to the app
    // containers and to each later init container.
    let sidecar = pod(json!({
        "initContainers": [
            {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": mib(3000)}},
            {"name": "warm", "resources": {"limits": mib(4000)}},
        ],
        "containers": [{"name": "a", "resources": {"limits": mib(1000)}}],
    }));
    assert_eq!(
        placed_charge(&node, &sidecar),
        amounts(&[(MEM, 7000), (CORES, 20)])
    );
}

proptest::proptest! {
    /// Whatever the pods and the order they come in, admitting each only
    /// when `check` passes never takes a namespace past its limit, and the
    /// running total is the sum of what was admitted.
    #[test]
    fn admitted_pods_never_pass_the_limit(
        limit in 0u64..20_000,
        asks in proptest::collection::vec(0u64..6_000, 0..40),
    ) {
        let quota = limits(&[(MEM, limit)]);
        let mut used = Charge::new();
        let mut admitted = 0;
        for ask in asks {
            let asked = amounts(&[(MEM, ask)]);
            if check(&quota, &used, &asked).is_ok() {
                accumulate(&mut used, &asked, true);
                admitted += ask;
            }
            let held = used.get(MEM).copied().unwrap_or(0);
            proptest::prop_assert!(held <= limit);
            proptest::prop_assert_eq!(held, admitted);
        }
    }
}
