//! End to end on real nodes: kube-apiserver, etcd, kube-scheduler with the
//! extender, kube-controller-manager, the `tessera-controller` binary, and
//! two nodes each running containerd, a kubelet v1.36 and the node agent with
//! fake GPUs. Pods run in real containers from locally built images; inside
//! them the interposer (mounted by the agent's Allocate answer and preloaded)
//! enforces the slice against the fake CUDA driver.
//!
//! Needs root, containerd, runc, the CNI plugins and busybox-static (`.ci/run`
//! installs them). Set `TESSERA_SKIP_REAL_NODES=1` to skip these tests on a
//! machine without them; they are never skipped silently.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tessera_api::v1alpha1::{AllocationPhase, NodeLock, VgpuAllocation};
use tessera_e2e::artifacts::Artifacts;
use tessera_e2e::node::{AgentMode, FakeGpu, NodeSpec, RealNode};
use tessera_e2e::stack::Tessera;
use tessera_e2e::testkit::{gpu_pod, number, phase, sample, section};
use tessera_e2e::{ControlPlane, images};

const WAIT: Duration = Duration::from_secs(90);
const MIB: u64 = 1 << 20;

/// One real-node stack at a time: each runs a control plane and up to two
/// nodes (containerd, kubelet, agent), which is all two cores can carry.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Fields drop in order: nodes are torn down before the control plane, and
/// the next test's turn comes last.
struct Stack {
    nodes: Vec<RealNode>,
    tessera: Tessera,
    client: Client,
    plane: ControlPlane,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Stack {
    async fn start(nodes: &[(&str, usize)]) -> Self {
        let turn = ONE_AT_A_TIME.lock().await;
        tessera_e2e::remove_stale_dirs();
        let artifacts = Artifacts::locate().unwrap();
        let plane = ControlPlane::start().await.unwrap();
        let client = plane.client().await.unwrap();
        let archives = images::build(&plane.dir().join("images"), &artifacts).unwrap();
        let tessera = Tessera::deploy(&plane, &artifacts).await.unwrap();
        let mut started = Vec::new();
        for (name, gpus) in nodes {
            let spec = NodeSpec {
                name: (*name).to_owned(),
                gpus: FakeGpu::many(name, *gpus, "NVIDIA A100-SXM4-80GB", 81920, 2),
                labels: BTreeMap::from([("gpu".to_owned(), "on".to_owned())]),
                agent: AgentMode::Host,
            };
            let node = RealNode::start(&plane, &spec, &artifacts, &archives)
                .await
                .unwrap();
            started.push(node);
        }
        Self {
            _turn: turn,
            nodes: started,
            tessera,
            client,
            plane,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, pod: Value) -> Pod {
        self.pods()
            .create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap()
    }

    /// Waits until `check` accepts the pod, failing with its last state.
    async fn wait_pod(&self, name: &str, what: &str, check: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + WAIT;
        loop {
            let pod = self.pods().get_opt(name).await.unwrap();
            if let Some(pod) = &pod
                && check(pod)
            {
                return pod.clone();
            }
            assert!(
                Instant::now() < deadline,
                "pod {name} never became {what}: {:#?}",
                pod.and_then(|p| p.status)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn wait_running(&self, name: &str) -> Pod {
        self.wait_pod(name, "Running", |p| phase(p) == "Running")
            .await
    }

    /// The container's output, through the API server and the kubelet.
    fn logs(&self, pod: &str) -> String {
        let output = self
            .plane
            .kubectl()
            .unwrap()
            .args(["logs", "-n", "default", pod])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "kubectl logs {pod}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits until the container printed `marker` and returns its output.
    async fn wait_output(&self, pod: &str, marker: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let out = self.logs(pod);
            if out.contains(marker) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "{pod} never printed {marker}:\n{out}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Stack {
    fn allocations(&self) -> Api<VgpuAllocation> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// Waits until the pod's allocation is Released or gone (garbage
    /// collected with its pod).
    async fn wait_released(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let allocation = self.allocations().get_opt(name).await.unwrap();
            let released = allocation.as_ref().is_none_or(|a| {
                a.status.as_ref().and_then(|s| s.phase) == Some(AllocationPhase::Released)
            });
            if released {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "allocation {name} not released: {:#?}",
                allocation.and_then(|a| a.status)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until the pod object is gone.
    async fn wait_gone(&self, name: &str) {
        let deadline = Instant::now() + WAIT;
        while self.pods().get_opt(name).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "pod {name} never went away");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// No NodeLock is held (every holder was served: its allocation's
    /// `Allocated` released the lock, which stays for the node's next pod).
    async fn assert_no_locks(&self) {
        let locks: Api<NodeLock> = Api::all(self.client.clone());
        let allocations: Api<VgpuAllocation> = Api::all(self.client.clone());
        let existing = allocations.list(&Default::default()).await.unwrap().items;
        let locks = locks.list(&Default::default()).await.unwrap().items;
        let held: Vec<&NodeLock> = locks.iter().filter(|l| l.held_among(&existing)).collect();
        assert!(held.is_empty(), "locks held after Allocate: {held:#?}");
    }

    /// The node agent's metrics text.
    async fn metrics(&self, node: usize) -> String {
        let addr = format!("127.0.0.1:{}", self.nodes[node].metrics_port());
        tessera_e2e::http::get_body(&addr, "/metrics")
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn a_pod_gets_its_slice_and_the_interposer_enforces_it_in_a_real_container() {
    let stack = Stack::start(&[("node-a", 2)]).await;
    const CHUNK: u64 = 64 * MIB;
    let script = format!(
        "echo '--- env'; env; echo '--- mounts'; cat /proc/mounts; \
         echo '--- limits'; cat /var/run/tessera/limits/limits.env; \
         echo '--- meminfo'; cuda-probe meminfo 0; \
         echo '--- alloc'; cuda-probe alloc plain {CHUNK} 1000; echo '--- end'; sleep 3600"
    );
    stack
        .create(gpu_pod("slice", 1024, Some(30), &script))
        .await;
    stack.wait_running("slice").await;
    let out = stack.wait_output("slice", "--- end").await;

    let env = section(&out, "--- env");
    let allocation: VgpuAllocation = Api::namespaced(stack.client.clone(), "default")
        .get("slice")
        .await
        .unwrap();
    let uuid = &allocation.spec.containers[0].devices[0].uuid;
    assert_eq!(env.get("NVIDIA_VISIBLE_DEVICES"), Some(uuid), "{out}");
    assert_eq!(
        env.get("CUDA_DEVICE_MEMORY_LIMIT_0").map(String::as_str),
        Some("1024m")
    );
    assert_eq!(
        env.get("CUDA_DEVICE_SM_LIMIT").map(String::as_str),
        Some("30")
    );
    let region = env
        .get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .expect("region path");
    let mounts = out
        .lines()
        .skip_while(|l| *l != "--- mounts")
        .take_while(|l| *l != "--- meminfo")
        .collect::<Vec<_>>()
        .join("\n");
    assert!(mounts.contains(" /etc/ld.so.preload "), "{mounts}");
    assert!(mounts.contains("libtessera_vgpu.so"), "{mounts}");
    let region_dir = std::path::Path::new(region)
        .parent()
        .unwrap()
        .display()
        .to_string();
    assert!(
        mounts.contains(&format!(" {region_dir} ")),
        "{region_dir} not in {mounts}"
    );
    // The agent's limits file, mounted read-only: what the interposer reads.
    let limits_mount = mounts
        .lines()
        .find(|l| l.contains(" /var/run/tessera/limits "))
        .unwrap_or_else(|| panic!("no limits mount in {mounts}"));
    assert!(
        limits_mount
            .split(' ')
            .nth(3)
            .is_some_and(|o| o.split(',').any(|o| o == "ro")),
        "{limits_mount}"
    );
    let limits = section(&out, "--- limits");
    assert_eq!(
        limits.get("CUDA_DEVICE_MEMORY_LIMIT_0").map(String::as_str),
        Some("1024m"),
        "{out}"
    );
    assert_eq!(
        limits.get("CUDA_DEVICE_SM_LIMIT"),
        env.get("CUDA_DEVICE_SM_LIMIT")
    );

    let meminfo = section(&out, "--- meminfo");
    assert_eq!(number(&meminfo, "total"), 1024 * MIB, "{out}");
    assert_eq!(number(&meminfo, "devtotal"), 1024 * MIB, "{out}");
    let free = number(&meminfo, "free");
    assert!(free <= 1024 * MIB && free > 1024 * MIB - 2 * CHUNK, "{out}");

    let alloc = section(&out, "--- alloc");
    assert_eq!(
        alloc.get("last_rc").map(String::as_str),
        Some("2"),
        "stops with CUDA_ERROR_OUT_OF_MEMORY: {out}"
    );
    let reached = number(&alloc, "allocated") * CHUNK;
    assert!(
        reached <= free && free < reached + CHUNK,
        "allocation stops at the limit: reached {reached} of {free} free: {out}"
    );

    assert_eq!(
        allocation.status.as_ref().and_then(|s| s.phase),
        Some(AllocationPhase::Allocated)
    );
    let locks: Api<NodeLock> = Api::all(stack.client.clone());
    let lock = locks.get_opt("node-a").await.unwrap();
    assert!(
        lock.is_none_or(|l| !l.held_among(std::slice::from_ref(&allocation))),
        "lock released after Allocate"
    );

    stack
        .pods()
        .delete("slice", &DeleteParams::default())
        .await
        .unwrap();
    stack.wait_released("slice").await;

    // The limit variables through `envFrom`, which the webhook cannot see:
    // the interposer holds them against the agent's read-only limits file
    // and refuses CUDA, naming the variable, rather than run at 80 GiB.
    let overrides: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "overrides", "namespace": "default"},
        "data": {"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(stack.client.clone(), "default")
        .create(&PostParams::default(), &overrides)
        .await
        .unwrap();
    let mut pod = gpu_pod(
        "from-configmap",
        1024,
        None,
        "echo \"env=$CUDA_DEVICE_MEMORY_LIMIT_0\"; cuda-probe meminfo 0 2>&1; echo \"rc=$?\"; echo '--- end'; sleep 3600",
    );
    pod["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "overrides"}}]);
    stack.create(pod).await;
    stack.wait_running("from-configmap").await;
    let out = stack.wait_output("from-configmap", "--- end").await;
    assert!(
        out.contains("env=80g"),
        "the kubelet applied envFrom: {out}"
    );
    assert!(!out.contains("rc=0"), "CUDA was not refused: {out}");
    assert!(
        out.contains("refusing CUDA: CUDA_DEVICE_MEMORY_LIMIT_0=\"80g\" in the environment, but the node agent's limits file /var/run/tessera/limits/limits.env says \"1024m\""),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn two_pods_share_one_gpu_each_with_its_own_limit_and_real_usage_in_metrics() {
    let stack = Stack::start(&[("node-s", 1)]).await;
    // The namespace's GPU memory quota has room for exactly these two pods.
    let quotas: Api<ResourceQuota> = Api::namespaced(stack.client.clone(), "default");
    let quota = json!({"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "3072"}}});
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(quota).unwrap(),
        )
        .await
        .unwrap();
    // The controller reads quotas from its own watch: wait until it refuses
    // what does not fit, before the two pods that do are created.
    tessera_e2e::testkit::wait_for("the quota reaches the controller", WAIT, async || {
        let big: Pod = serde_json::from_value(gpu_pod("too-big", 4096, None, "true")).unwrap();
        let refused = stack
            .pods()
            .create(&PostParams::default(), &big)
            .await
            .is_err();
        if !refused {
            let _ = stack
                .pods()
                .delete("too-big", &DeleteParams::default())
                .await;
            stack.wait_gone("too-big").await;
        }
        refused.then_some(())
    })
    .await;
    let pods = [("share-1", 1024, 600 * MIB), ("share-2", 2048, 1500 * MIB)];
    for (name, limit, hold) in pods {
        // share-1 also launches kernels without pause, under its 20 %.
        let launch = if name == "share-1" {
            " & cuda-probe launch kernel 3600 10000 >/dev/null"
        } else {
            ""
        };
        let script = format!(
            "echo '--- meminfo'; cuda-probe meminfo 0; echo '--- hold'; cuda-probe hold {hold}{launch}"
        );
        stack.create(gpu_pod(name, limit, Some(20), &script)).await;
    }
    let mut devices = Vec::new();
    for (name, limit, _) in pods {
        stack.wait_running(name).await;
        let out = stack.wait_output(name, "ready=1").await;
        assert_eq!(
            number(&section(&out, "--- meminfo"), "total"),
            limit * MIB,
            "{name} sees its own limit: {out}"
        );
        let allocation = stack.allocations().get(name).await.unwrap();
        devices.push(allocation.spec.containers[0].devices[0].uuid.clone());
    }
    assert_eq!(devices[0], devices[1], "both pods share the node's one GPU");

    // The agent reads each container's shared region: what its processes
    // hold now (the held allocation, whole granules, plus any context charge).
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = stack.metrics(0).await;
        let usage: Vec<_> = pods
            .iter()
            .map(|(name, limit, hold)| {
                let used = sample(&metrics, "hami_vgpu_memory_used_bytes", name);
                let ok = used.is_some_and(|u| u >= *hold as f64 && u <= (*limit * MIB) as f64);
                (name, used, ok)
            })
            .collect();
        if usage.iter().all(|(_, _, ok)| *ok) {
            for (name, limit, _) in pods {
                assert_eq!(
                    sample(&metrics, "hami_vgpu_memory_limit_bytes", name),
                    Some((limit * MIB) as f64)
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "usage never showed: {usage:?}\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stack.assert_no_locks().await;

    // Compute use, from the GPU time the interposer measured (the GPU is
    // shared, so HAMi's `default` policy limits both): share-1 runs at its
    // 20 % (the limiter lets a moment of saved-up time through, so a
    // window may read a little over), share-2 sits idle.
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = stack.metrics(0).await;
        let used = |pod| sample(&metrics, "hami_vgpu_core_used_percent", pod);
        let limit = |pod| sample(&metrics, "hami_vgpu_core_limit_percent", pod);
        let seen = [used("share-1"), used("share-2")];
        if seen[0].is_some_and(|u| (15.0..=23.0).contains(&u)) && seen[1] == Some(0.0) {
            assert_eq!([limit("share-1"), limit("share-2")], [Some(20.0); 2]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "compute use (share-1, share-2) never read 15-23 % and 0: {seen:?}\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The quota is full: a third pod is refused, naming it, and the quota's
    // status shows the usage beside kube-controller-manager's own fields.
    let third: Pod = serde_json::from_value(gpu_pod("share-3", 512, None, "true")).unwrap();
    let refused = stack
        .pods()
        .create(&PostParams::default(), &third)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("ResourceQuota \"gpu\" allows limits.nvidia.com/gpumem: 3072; the namespace's pods hold 3072, this pod would add 512"),
        "{refused}"
    );
    tessera_e2e::testkit::wait_for("the quota's status shows the usage", WAIT, async || {
        let status = quotas.get("gpu").await.ok()?.status?;
        let key = "limits.nvidia.com/gpumem";
        let used = status.used?.get(key)?.0.clone();
        let hard = status.hard?.get(key)?.0.clone();
        (used == "3072" && hard == "3072").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn deleting_a_pod_or_completing_a_job_releases_its_allocation() {
    let stack = Stack::start(&[("node-r", 1)]).await;
    stack
        .create(gpu_pod("doomed", 1024, Some(10), "sleep 3600"))
        .await;
    stack.wait_running("doomed").await;
    stack.assert_no_locks().await;
    stack
        .pods()
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    stack.wait_released("doomed").await;

    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "once", "namespace": "default"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "cuda", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                    "command": ["cuda-probe", "meminfo", "0"],
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 512}},
                }],
            }},
        },
    });
    let jobs: Api<k8s_openapi::api::batch::v1::Job> =
        Api::namespaced(stack.client.clone(), "default");
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job).unwrap(),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + WAIT;
    let pod = loop {
        let list = stack
            .pods()
            .list(&kube::api::ListParams::default().labels("job-name=once"))
            .await
            .unwrap();
        if let Some(pod) = list.items.into_iter().find(|p| phase(p) == "Succeeded") {
            break pod;
        }
        assert!(Instant::now() < deadline, "the Job's pod never succeeded");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let name = kube::ResourceExt::name_any(&pod);
    let out = stack.logs(&name);
    assert_eq!(
        number(&section(&format!("---\n{out}"), "---"), "total"),
        512 * MIB,
        "{out}"
    );
    stack.wait_released(&name).await;
    stack.assert_no_locks().await;
}

/// A GPU pod of the stream: reports its view, then allocates until refused.
fn stream_pod(name: &str) -> Value {
    const CHUNK: u64 = 32 * MIB;
    let script = format!(
        "echo '--- env'; env; echo '--- meminfo'; cuda-probe meminfo 0; \
         echo '--- alloc'; cuda-probe alloc plain {CHUNK} 1000; echo '--- end'; sleep 3600"
    );
    gpu_pod(name, 512, Some(10), &script)
}

impl Stack {
    /// Creates a pod, retrying while the API server refuses it because the
    /// webhook is down (failurePolicy Fail), as a controller would. Returns
    /// how many times it was refused.
    async fn create_retrying(&self, pod: Value) -> u32 {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let deadline = Instant::now() + WAIT;
        let mut refused = 0;
        loop {
            match self.pods().create(&PostParams::default(), &pod).await {
                Ok(_) => return refused,
                Err(kube::Error::Api(status)) if status.code >= 500 => refused += 1,
                Err(error) => panic!("creating {:?}: {error}", pod.metadata.name),
            }
            assert!(Instant::now() < deadline, "the webhook never came back");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// I1-I4 over every pod and allocation in the namespace.
    async fn check_invariants(&self, pods: &[String], limit_mib: u64) {
        let allocations = self
            .allocations()
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        // I1: per device, live allocations fit its memory, cores and slices.
        let mut per_device: BTreeMap<String, (u64, u32, u32)> = BTreeMap::new();
        for allocation in &allocations {
            let phase = allocation.status.as_ref().and_then(|s| s.phase);
            if phase == Some(AllocationPhase::Released) {
                continue;
            }
            for slice in allocation.spec.containers.iter().flat_map(|c| &c.devices) {
                let entry = per_device.entry(slice.uuid.clone()).or_default();
                entry.0 += slice.memory_mib;
                entry.1 += slice.cores;
                entry.2 += 1;
            }
        }
        for (uuid, (mib, cores, count)) in &per_device {
            assert!(
                *mib <= 81920 && *cores <= 100 && *count <= 10,
                "I1 broken on {uuid}: {mib} MiB, {cores} cores, {count} slices"
            );
        }
        for name in pods {
            let pod = self.pods().get(name).await.unwrap();
            // I2: one allocation, for this very pod.
            let owned: Vec<_> = allocations
                .iter()
                .filter(|a| a.spec.pod_name == *name)
                .collect();
            assert_eq!(owned.len(), 1, "I2: {name} has {} allocations", owned.len());
            let allocation = owned[0];
            assert_eq!(
                Some(&allocation.spec.pod_uid),
                pod.metadata.uid.as_ref(),
                "I2: {name}"
            );
            assert_eq!(
                allocation.status.as_ref().and_then(|s| s.phase),
                Some(AllocationPhase::Allocated),
                "{name} was served"
            );
            // The container got exactly its allocation's slice.
            let out = self.wait_output(name, "--- end").await;
            let env = section(&out, "--- env");
            let uuid = &allocation.spec.containers[0].devices[0].uuid;
            assert_eq!(
                env.get("NVIDIA_VISIBLE_DEVICES"),
                Some(uuid),
                "{name}: {out}"
            );
            assert_eq!(
                number(&section(&out, "--- meminfo"), "total"),
                limit_mib * MIB,
                "{name}: {out}"
            );
            // I4: the container's processes never got past the limit.
            let alloc = section(&out, "--- alloc");
            assert_eq!(
                alloc.get("last_rc").map(String::as_str),
                Some("2"),
                "{name}: {out}"
            );
            assert!(
                number(&alloc, "allocated") * 32 * MIB <= limit_mib * MIB,
                "I4: {name}: {out}"
            );
        }
        // I3: no node stays locked once every holder is served.
        self.assert_no_locks().await;
    }
}

/// The kubelet's verdict on a pod it refused at admission.
fn admission_rejection(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    (status.phase.as_deref() == Some("Failed")
        && status.reason.as_deref() == Some("UnexpectedAdmissionError"))
    .then(|| status.message.clone().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn restarts_during_a_stream_of_pods_leave_every_pod_served_and_the_invariants_intact() {
    let mut stack = Stack::start(&[("node-x", 2), ("node-y", 2)]).await;
    let names: Vec<String> = (0..12).map(|i| format!("stream-{i}")).collect();
    let mut refused = 0;
    for (i, name) in names.iter().enumerate() {
        refused += stack.create_retrying(stream_pod(name)).await;
        match i {
            2 => {
                stack.nodes[0].stop_kubelet();
                stack.nodes[0].start_kubelet().await.unwrap();
            }
            5 => {
                stack.nodes[1].stop_agent();
                stack.nodes[1].start_agent().unwrap();
            }
            8 => {
                stack.tessera.stop(&stack.plane);
                // A pod created meanwhile is refused (the webhook is down);
                // retried once the controller is back.
                tokio::time::sleep(Duration::from_millis(500)).await;
                stack.tessera.start(&stack.plane).await.unwrap();
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    // A kubelet rejects a device pod it admits before the device plugin has
    // (re-)registered: right after the kubelet restarts (it admits the pods
    // already bound to it at once) or while the agent restarts. Such a pod is
    // terminal (a controller would replace it): it must hold nothing, and
    // its replacement must be served.
    let mut rejected = Vec::new();
    for name in &names {
        let pod = stack
            .wait_pod(name, "Running or rejected at admission", |p| {
                phase(p) == "Running" || admission_rejection(p).is_some()
            })
            .await;
        if let Some(message) = admission_rejection(&pod) {
            assert!(message.contains("nvidia.com/gpu"), "{name}: {message}");
            // Only the kubelet restart may cost a pod: the agent drains
            // before it stops and the extender avoids a node whose agent is
            // not registered.
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            assert_eq!(
                node,
                Some("node-x"),
                "{name} rejected on {node:?}: {message}"
            );
            rejected.push(name.clone());
        }
    }
    eprintln!(
        "pod creations refused while the webhook was down: {refused}; \
         pods rejected by a kubelet before the agent registered: {rejected:?}"
    );
    for name in &rejected {
        stack.wait_released(name).await;
        stack
            .pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        stack.wait_gone(name).await;
        stack.create_retrying(stream_pod(name)).await;
        stack.wait_running(name).await;
    }
    stack.check_invariants(&names, 512).await;

    for name in &names {
        stack
            .pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in &names {
        stack.wait_released(name).await;
    }
    stack.assert_no_locks().await;
}

/// The low-priority container's region as the agent's host path holds it.
fn region_of(stack: &Stack, pod: &Pod) -> tessera_vgpu_region::Snapshot {
    let uid = pod.metadata.uid.as_deref().unwrap();
    let path = stack.nodes[0]
        .dir()
        .join(format!("agent/containers/{uid}_cuda/region"));
    tessera_vgpu_region::Region::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .snapshot()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn a_high_priority_pod_holds_a_low_priority_one_back_on_their_gpu() {
    let stack = Stack::start(&[("node-p", 1)]).await;
    // Both pods launch kernels on the node's one GPU for a while; the one
    // asking for nvidia.com/priority 0 holds the other back.
    let launching = "cuda-probe launch kernel 20 64; echo '--- end'; sleep 3600";
    let mut low = gpu_pod("low", 2000, Some(60), launching);
    let mut high = gpu_pod("high", 2000, Some(30), launching);
    high["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = json!(0);
    low["spec"]["containers"][0]["env"] =
        json!([{"name": "FAKE_CUDA_NS_PER_BLOCK", "value": "20000"}]);
    high["spec"]["containers"][0]["env"] = low["spec"]["containers"][0]["env"].clone();
    stack.create(low).await;
    let low = stack.wait_running("low").await;
    stack.create(high).await;
    let high = stack.wait_running("high").await;

    let mut priorities = Vec::new();
    for pod in ["high", "low"] {
        let allocation = stack.allocations().get(pod).await.unwrap();
        priorities.push(allocation.spec.containers[0].priority);
    }
    assert_eq!(priorities, [Some(0), None]);

    // The agent's arbiter holds the low-priority container on the shared GPU.
    let deadline = Instant::now() + WAIT;
    let held = loop {
        let before = Instant::now();
        let high_region = region_of(&stack, &high);
        let low_region = region_of(&stack, &low);
        if high_region.priority == tessera_vgpu_region::Priority::High
            && low_region.hold.is_some_and(|(devices, _)| devices & 1 == 1)
        {
            break low_region;
        }
        assert!(
            before < deadline,
            "never held: high {high_region:?}\nlow {low_region:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // While held, the low-priority container's launches wait inside the
    // interposer: it records no launch, while the high-priority one goes on.
    // (A launch already past the check when the hold came may still finish.)
    let launched = |snapshot: &tessera_vgpu_region::Snapshot| snapshot.processes[0].active_at;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (low_before, high_before) = (
        launched(&region_of(&stack, &low)),
        launched(&region_of(&stack, &high)),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (low_now, high_now) = (region_of(&stack, &low), region_of(&stack, &high));
    assert_eq!(
        launched(&low_now),
        low_before,
        "held since {held:?}: {low_now:?}"
    );
    assert!(launched(&high_now) > high_before, "not held: {high_now:?}");

    // The agent found each container process's host pid (they run in their
    // own pid namespaces).
    for snapshot in [&low_now, &high_now] {
        let process = &snapshot.processes[0];
        let host = process.host_pid.expect("host pid written by the agent");
        let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap();
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|p| p.parse::<u32>().ok());
        assert_eq!(inner, Some(process.pid), "{status}");
        assert_ne!(host, process.pid, "a container pid namespace");
    }
}

/// A Kueue object of `kind` (`v1beta2`), cluster-wide or in `default`.
fn kueue_api(client: &Client, kind: &str, namespaced: bool) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind);
    let resource = kube::api::ApiResource::from_gvk(&gvk);
    if namespaced {
        Api::namespaced_with(client.clone(), "default", &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    }
}

/// A suspended Job in Kueue's LocalQueue `gpus`, one GPU of `mib` MiB,
/// running `script`.
fn queued_job(name: &str, mib: u64, script: &str) -> k8s_openapi::api::batch::v1::Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "labels": {"kueue.x-k8s.io/queue-name": "gpus"}},
        "spec": {
            "suspend": true,
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "cuda", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib}},
                }],
            }},
        },
    }))
    .unwrap()
}

/// Whether the Kueue Workload of Job `job` has condition `kind` True.
async fn workload_condition(client: &Client, job: &str, kind: &str) -> bool {
    let workloads = kueue_api(client, "Workload", true);
    let list = workloads.list(&Default::default()).await.unwrap();
    list.items.iter().any(|w| {
        let owned = w
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.name == job);
        owned
            && w.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn kueue_admits_gpu_jobs_by_their_total_memory_and_tessera_binds_them_at_once() {
    let stack = Stack::start(&[("node-k", 1)]).await;
    // Kueue's HAMi guide: quota on what all of a pod's vGPUs hold.
    stack
        .plane
        .start_kueue(json!({"transformations": [{
            "input": "nvidia.com/gpumem", "strategy": "Replace", "multiplyBy": "nvidia.com/gpu",
            "outputs": {"nvidia.com/total-gpumem": "1"},
        }]}))
        .await
        .unwrap();
    let client = &stack.client;
    let create = async |kind: &str, namespaced: bool, object: Value| {
        let object: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
        kueue_api(client, kind, namespaced)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    };
    create(
        "ResourceFlavor",
        false,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": "default-flavor"},
        }),
    )
    .await;
    create(
        "ClusterQueue",
        false,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "vgpu"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{
                    "coveredResources": ["nvidia.com/gpu", "nvidia.com/total-gpumem"],
                    "flavors": [{"name": "default-flavor", "resources": [
                        {"name": "nvidia.com/gpu", "nominalQuota": 4},
                        {"name": "nvidia.com/total-gpumem", "nominalQuota": 3072},
                    ]}],
                }],
            },
        }),
    )
    .await;
    create(
        "LocalQueue",
        true,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "gpus", "namespace": "default"},
            "spec": {"clusterQueue": "vgpu"},
        }),
    )
    .await;

    // Two jobs of 2,048 MiB against 3,072: the first runs for a few
    // seconds, the second waits for its quota.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), "default");
    jobs.create(
        &PostParams::default(),
        &queued_job("first", 2048, "cuda-probe meminfo 0; sleep 4"),
    )
    .await
    .unwrap();
    tessera_e2e::testkit::wait_for("Kueue admits the first job", WAIT, async || {
        workload_condition(client, "first", "Admitted")
            .await
            .then_some(())
    })
    .await;
    jobs.create(
        &PostParams::default(),
        &queued_job("second", 2048, "cuda-probe meminfo 0"),
    )
    .await
    .unwrap();
    let bound = async |job: &str| -> bool {
        let selector = format!("job-name={job}");
        let list = stack
            .pods()
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap();
        list.items
            .iter()
            .any(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
    };
    tessera_e2e::testkit::wait_for("the first job's pod is bound", WAIT, async || {
        bound("first").await.then_some(())
    })
    .await;
    // While the first runs, the second is queued: not admitted, suspended.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!workload_condition(client, "second", "Admitted").await);
    let second = jobs.get("second").await.unwrap();
    assert_eq!(second.spec.and_then(|s| s.suspend), Some(true));

    // The first finishes; Kueue admits the second; Tessera binds its pod
    // within seconds of the admission (HAMi #1368: minutes).
    let deadline = Instant::now() + WAIT;
    let admitted = loop {
        if workload_condition(client, "second", "Admitted").await {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the second job was never admitted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let deadline = admitted + Duration::from_secs(30);
    while !bound("second").await {
        assert!(
            Instant::now() < deadline,
            "the second job's pod was never bound"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = admitted.elapsed();
    println!("kueue: the second job's pod was bound {took:?} after its admission was seen");
    assert!(
        took < Duration::from_secs(5),
        "bound {took:?} after admission"
    );
    let first = jobs.get("first").await.unwrap();
    assert!(
        first.status.and_then(|s| s.succeeded) == Some(1),
        "the second was admitted only when the first succeeded"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    skip_real_nodes,
    ignore = "needs real nodes; built with TESSERA_SKIP_REAL_NODES set"
)]
async fn a_high_priority_pod_displaces_the_pod_whose_slice_it_needs_on_a_full_node() {
    let stack = Stack::start(&[("node-p", 2)]).await;
    for (name, value) in [("batch", 100), ("serving", 1000)] {
        let class = json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
        });
        Api::<k8s_openapi::api::scheduling::v1::PriorityClass>::all(stack.client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(class).unwrap(),
            )
            .await
            .unwrap();
    }
    // Two 80 GiB GPUs: batch-a holds 60,000 MiB of one, batch-b 30,000 of
    // the other (spread).
    for (name, mib) in [("batch-a", 60_000), ("batch-b", 30_000)] {
        let mut pod = gpu_pod(name, mib, None, "sleep 3600");
        pod["spec"]["priorityClassName"] = json!("batch");
        stack.create(pod).await;
        stack.wait_running(name).await;
    }
    let started = Instant::now();
    // 55,000 MiB fit neither GPU; either pod's GPU would be enough once
    // its pod is gone. kube-scheduler's order gives batch-a back first (it
    // alone leaves room on the other GPU), so exactly batch-b goes.
    let mut urgent = gpu_pod("urgent", 55_000, None, "cuda-probe meminfo 0; sleep 3600");
    urgent["spec"]["priorityClassName"] = json!("serving");
    stack.create(urgent).await;
    stack.wait_running("urgent").await;
    println!(
        "real nodes: the preemptor ran {:?} after it was created",
        started.elapsed()
    );
    // batch-b's pod is gone or going; batch-a runs on.
    let batch_b = stack.pods().get_opt("batch-b").await.unwrap();
    assert!(
        batch_b.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "batch-b was displaced"
    );
    let batch_a = stack.pods().get("batch-a").await.unwrap();
    assert_eq!(phase(&batch_a), "Running");
    assert!(
        batch_a.metadata.deletion_timestamp.is_none(),
        "batch-a was spared"
    );
    let urgent = stack.allocations().get("urgent").await.unwrap();
    assert_eq!(urgent.spec.nomination, None);
    assert_eq!(urgent.spec.priority, Some(1000));
}
