//! The Helm chart without nodes: `helm lint --strict`, what `helm template`
//! renders for the default values and for a file turning every option on, the
//! values schema refusing bad values by name, and the rendered objects passing
//! a real API server's validation. RBAC and the install/upgrade cycle against
//! a real API server are in `chart_install.rs`.

use std::collections::BTreeSet;

use serde_json::Value;
use tessera_e2e::helm;

fn template(extra: &[&str]) -> Vec<Value> {
    let mut command = helm::command(None).unwrap();
    command
        .args(["template", "tessera", "--namespace", "tessera-system"])
        .arg(helm::chart_dir())
        .args(extra);
    helm::objects(&helm::run(&mut command).unwrap()).unwrap()
}

fn all_on() -> Vec<Value> {
    let values = helm::all_on_values();
    template(&["-f", values.to_str().unwrap()])
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .or(container["command"].as_array())
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn lint_is_clean_with_default_and_all_on_values() {
    let values = helm::all_on_values();
    for extra in [vec![], vec!["-f", values.to_str().unwrap()]] {
        let mut command = helm::command(None).unwrap();
        command
            .args(["lint", "--strict"])
            .arg(helm::chart_dir())
            .args(&extra);
        let out = helm::run(&mut command).unwrap();
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
}

#[test]
fn default_values_render_a_working_install() {
    let objects = template(&[]);
    let deployment = find(&objects, "Deployment", "tessera-scheduler");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "tessera-scheduler");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(deployment["spec"]["replicas"], 2);

    // kube-scheduler: the cluster's version by default, its config mounted.
    let scheduler = container(deployment, "kube-scheduler");
    assert_eq!(
        scheduler["image"], "registry.k8s.io/kube-scheduler:v1.36.0",
        "helm's built-in cluster version (v1.36 build) picks the image tag"
    );
    let config = find(&objects, "ConfigMap", "tessera-scheduler");
    let sched: Value =
        serde_yaml_ng::from_str(config["data"]["kube-scheduler.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(sched["profiles"][0]["schedulerName"], "tessera-scheduler");
    let extender = &sched["extenders"][0];
    assert_eq!(extender["urlPrefix"], "http://127.0.0.1:8888");
    assert_eq!(extender["bindVerb"], "bind");
    assert_eq!(extender["preemptVerb"], "preempt");
    assert_eq!(extender["httpTimeout"], "30s");
    let managed: Vec<&str> = extender["managedResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        managed,
        [
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
            "nvidia.com/priority"
        ]
    );
    assert_eq!(sched["leaderElection"]["leaderElect"], true);

    // The controller: extender on loopback only, its settings from values.
    let controller = container(deployment, "controller");
    let controller_args = args(controller);
    assert!(controller_args.contains(&"--extender-addr=127.0.0.1:8888".to_owned()));
    assert!(controller_args.contains(&"--lease-namespace=tessera-system".to_owned()));
    let settings: Value =
        serde_yaml_ng::from_str(config["data"]["controller.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(settings["schedulerName"], "tessera-scheduler");
    assert_eq!(settings["nodeLockWaitMillis"], 20000);
    assert_eq!(controller["readinessProbe"]["httpGet"]["path"], "/readyz");

    // The webhook: chart-issued certificate, the CA in the registration.
    let secret = find(&objects, "Secret", "tessera-webhook-tls");
    let webhook = &find(&objects, "MutatingWebhookConfiguration", "tessera")["webhooks"][0];
    assert_eq!(webhook["failurePolicy"], "Fail");
    assert_eq!(
        webhook["clientConfig"]["caBundle"],
        secret["data"]["ca.crt"]
    );
    assert_eq!(
        webhook["clientConfig"]["service"]["name"],
        "tessera-controller"
    );
    let condition = webhook["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        condition.contains("k in ['nvidia.com/gpu', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage', 'nvidia.com/gpucores', 'nvidia.com/priority']"),
        "{condition}"
    );
    assert!(!kinds(&objects).contains("Certificate"));
    find(&objects, "PodDisruptionBudget", "tessera-scheduler");

    // The agent: real GPUs through NVML, on gpu=on nodes, node-critical.
    let daemonset = find(&objects, "DaemonSet", "tessera-node-agent");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["gpu"], "on");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["hostPID"], true);
    let agent_args = args(container(daemonset, "node-agent"));
    for expected in [
        "--backend=nvml",
        // Not envvar: a container's own NVIDIA_VISIBLE_DEVICES cannot pick GPUs.
        "--device-list-strategy=cdi-cri",
        "--interposer-library=/usr/local/vgpu/libtessera_vgpu.so",
        "--install-interposer-from=/opt/tessera/lib/libtessera_vgpu.so",
        // Beside the agent pods, so each pod owns its Lease.
        "--lease-namespace=tessera-system",
        "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
    ] {
        assert!(agent_args.contains(&expected.to_owned()), "{agent_args:?}");
    }
    assert!(
        !agent_args
            .iter()
            .any(|a| a.starts_with("--device-list-strategy=") && a.contains("envvar")),
        "the default strategy is not envvar: {agent_args:?}"
    );
    assert!(
        !agent_args.contains(&"--accept-envvar-device-selection".to_owned()),
        "{agent_args:?}"
    );
    let env: Vec<&str> = container(daemonset, "node-agent")["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for name in ["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_UID"] {
        assert!(env.contains(&name), "{env:?}");
    }
    assert!(controller_args.contains(&"--agent-lease-namespace=tessera-system".to_owned()));
    assert!(!agent_args.iter().any(|a| a.starts_with("--fake-gpus-file")));
    assert!(!agent_args.contains(&"--legacy-metrics".to_owned()));
    // Profiling is off unless asked for.
    for args in [&controller_args, &agent_args] {
        assert!(
            !args.iter().any(|a| a.starts_with("--profiling")),
            "{args:?}"
        );
    }

    // The MPS host: beside every agent, holding the daemons in its own
    // pod, with no API credentials.
    let mps = find(&objects, "DaemonSet", "tessera-mps");
    let mps_pod = &mps["spec"]["template"]["spec"];
    assert_eq!(mps_pod["nodeSelector"], pod["nodeSelector"]);
    assert_eq!(mps_pod["automountServiceAccountToken"], false);
    let host = container(mps, "mps-host");
    assert_eq!(
        args(host)[..3],
        [
            "mps-daemons",
            "--backend=nvml",
            "--state-dir=/var/lib/tessera"
        ]
    );
    let mounts: Vec<&str> = host["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["/var/lib/tessera", "/dev/shm"]);
    assert!(args(host).contains(&"--shm-size-mib=1024".to_owned()));
    // Its init container mounts the clients' /dev/shm as a bounded tmpfs,
    // propagated to the node.
    let init = &mps_pod["initContainers"][0];
    assert_eq!(init["name"], "mps-shm");
    assert_eq!(
        args(init)[..4],
        [
            "mps-daemons",
            "--mount-shm",
            "--state-dir=/var/lib/tessera",
            "--shm-size-mib=1024"
        ]
    );
    assert_eq!(
        init["volumeMounts"][0]["mountPropagation"], "Bidirectional",
        "{init}"
    );
    assert_eq!(init["securityContext"]["privileged"], true);
    let off = template(&["--set", "agent.mpsHost.enabled=false"]);
    assert!(
        !off.iter()
            .any(|o| o["metadata"]["name"] == "tessera-mps" && o["kind"] == "DaemonSet")
    );

    // Off by default: the GpuNodeConfig and the Prometheus operator's kinds.
    let rendered = kinds(&objects);
    for absent in ["GpuNodeConfig", "ServiceMonitor", "PrometheusRule"] {
        assert!(!rendered.contains(absent), "{absent} rendered by default");
    }
    find(
        &objects,
        "ValidatingAdmissionPolicy",
        "tessera-node-agent-own-node",
    );
}

#[test]
fn every_option_reaches_the_objects() {
    let objects = all_on();
    let deployment = find(&objects, "Deployment", "tessera-scheduler");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        container(deployment, "kube-scheduler")["image"],
        "registry.example.com/kube-scheduler:v1.36.3"
    );
    assert_eq!(
        container(deployment, "controller")["image"],
        "registry.example.com/tessera-controller:dev"
    );
    let controller_args = args(container(deployment, "controller"));
    for expected in [
        "--profiling",
        "--profiling-addr=127.0.0.1:6070",
        "--tuning-interval-seconds=60",
        "--tuning-window-seconds=86400",
        "--tuning-min-observed-seconds=7200",
        "--tuning-wait-seconds=300",
        "--tuning-write-gap-seconds=1800",
    ] {
        assert!(
            controller_args.contains(&expected.to_owned()),
            "{controller_args:?}"
        );
    }
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"][0]["name"], "registry-credentials");
    assert!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );
    assert_eq!(
        container(deployment, "controller")["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT")
            .unwrap()["value"],
        "http://otel-collector.observability:4317"
    );

    // Renamed resources flow into kube-scheduler, the webhook and the agent.
    let config = find(&objects, "ConfigMap", "tessera-scheduler");
    let sched: Value =
        serde_yaml_ng::from_str(config["data"]["kube-scheduler.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(sched["profiles"][0]["schedulerName"], "gpu-scheduler");
    assert_eq!(sched["extenders"][0]["weight"], 5);
    assert_eq!(sched["extenders"][0]["httpTimeout"], "15s");
    assert_eq!(
        sched["extenders"][0]["managedResources"][3]["name"],
        "example.com/vgpu-cores"
    );
    let webhook = find(&objects, "MutatingWebhookConfiguration", "tessera");
    let condition = webhook["webhooks"][0]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        condition.contains("'example.com/vgpu-cores'"),
        "{condition}"
    );
    assert!(!condition.contains("nvidia.com/"), "{condition}");

    // cert-manager issues the certificate and injects the CA.
    assert_eq!(
        webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "tessera-system/tessera-webhook-tls"
    );
    assert!(webhook["webhooks"][0]["clientConfig"]["caBundle"].is_null());
    let certificate = find(&objects, "Certificate", "tessera-webhook-tls");
    assert_eq!(certificate["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    assert_eq!(certificate["spec"]["duration"], "2160h");
    assert!(
        !objects
            .iter()
            .any(|o| o["kind"] == "Secret" || o["kind"] == "Issuer"),
        "with an issuerRef the chart creates neither a Secret nor an Issuer"
    );

    // The agent: fake GPUs per node, every device-list strategy, legacy metrics.
    let daemonset = find(&objects, "DaemonSet", "tessera-node-agent");
    let agent_args = args(container(daemonset, "node-agent"));
    for expected in [
        "--backend=fake",
        "--fake-gpus-file=/etc/tessera/fake-gpus/$(NODE_NAME).yaml",
        "--device-list-strategy=envvar,cdi-cri,cdi-annotations",
        "--legacy-metrics",
        "--profiling",
        "--profiling-addr=127.0.0.1:6071",
        "--resource-name=example.com/vgpu",
        "--drain-seconds=20",
    ] {
        assert!(agent_args.contains(&expected.to_owned()), "{agent_args:?}");
    }
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert_eq!(pod["terminationGracePeriodSeconds"], 40);
    let fake = find(&objects, "ConfigMap", "tessera-fake-gpus");
    let gpus: Value =
        serde_yaml_ng::from_str(fake["data"]["gpu-node-1.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(gpus["devices"][1]["health"], "Unhealthy");
    let defaults = find(&objects, "ConfigMap", "tessera-node-agent");
    let defaults: Value =
        serde_yaml_ng::from_str(defaults["data"]["node-defaults.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(defaults["deviceSplitCount"], 4);
    assert_eq!(defaults["filterDevices"]["indexes"][0], 7);

    let config = find(&objects, "GpuNodeConfig", "a100-nodes");
    assert_eq!(config["spec"]["deviceSplitCount"], 7);
    let pdb = find(&objects, "PodDisruptionBudget", "tessera-scheduler");
    assert_eq!(pdb["spec"]["minAvailable"], 2);

    // Per-pod series keep the workload's `pod` and `namespace` labels
    // (HAMi's dashboards and the tuning guide read them).
    for monitor in ["tessera-node-agent", "tessera-controller"] {
        let monitor = find(&objects, "ServiceMonitor", monitor);
        assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
    }
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    // helm names the key as a JSON pointer (`/nodeDefaults/deviceSplitCount`).
    let cases: [(&[&str], &str); 13] = [
        (
            &["--set", "scheduler.tuning.intervalSeconds=0"],
            "/scheduler/tuning/intervalSeconds",
        ),
        (
            &["--set", "nodeDefaults.deviceSplitCount=0"],
            "/nodeDefaults/deviceSplitCount",
        ),
        (
            &["--set", "nodeDefaults.deviceMemoryScaling=0"],
            "/nodeDefaults/deviceMemoryScaling",
        ),
        (
            &["--set", "nodeDefaults.deviceCoreScaling=-1"],
            "/nodeDefaults/deviceCoreScaling",
        ),
        (
            &["--set", "config.gpuSchedulerPolicy=random"],
            "/config/gpuSchedulerPolicy",
        ),
        (
            &["--set", "config.defaultGPUNum=0"],
            "/config/defaultGPUNum",
        ),
        (&["--set", "agent.backend=cuda"], "/agent/backend"),
        (
            &["--set", "agent.mpsHost.shmSizeMiB=0"],
            "/agent/mpsHost/shmSizeMiB",
        ),
        (
            &["--set", "agent.deviceListStrategy={volume-mounts}"],
            "/agent/deviceListStrategy",
        ),
        (
            &["--set", "agent.deviceListStrategy={envvar}"],
            "agent.acceptEnvvarDeviceSelection=true",
        ),
        (&["--set", "agnet.backend=fake"], "agnet"),
        (&["--set", "scheduler.controler.log=debug"], "controler"),
        (
            &["--set", "scheduler.kubeScheduler.httpTimeoutSeconds=10"],
            "scheduler.kubeScheduler.httpTimeoutSeconds (10 s) must exceed config.nodeLockWaitMillis",
        ),
    ];
    for (values, key) in cases {
        let mut command = helm::command(None).unwrap();
        command
            .args(["template", "tessera"])
            .arg(helm::chart_dir())
            .args(values);
        let output = helm::output(&mut command).unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{values:?} was accepted");
        assert!(
            stderr.contains(key),
            "{values:?}: the error does not name {key}: {stderr}"
        );
    }
    // A fake backend needs fake GPUs.
    let mut command = helm::command(None).unwrap();
    command
        .args(["template", "tessera"])
        .arg(helm::chart_dir())
        .args(["--set", "agent.backend=fake"]);
    let output = helm::output(&mut command).unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("agent.fakeGpus"));
}

#[tokio::test]
async fn rendered_objects_pass_the_api_servers_validation() {
    let cluster = tessera_e2e::shared().await.unwrap();
    let status = cluster
        .kubectl()
        .unwrap()
        .args(["create", "namespace", "chart-dry-run"])
        .output()
        .unwrap();
    assert!(
        status.status.success()
            || String::from_utf8_lossy(&status.stderr).contains("AlreadyExists")
    );
    // The Prometheus operator's and cert-manager's kinds are not installed
    // here; everything else goes through the server's full validation
    // (schemas, CEL of the admission policy and the webhook's matchConditions).
    let skip = ["ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"];
    for objects in [template(&["--namespace", "chart-dry-run"]), all_on()] {
        let mut items = Vec::new();
        for object in objects
            .iter()
            .filter(|o| !skip.contains(&o["kind"].as_str().unwrap()))
        {
            let mut object = object.clone();
            if object["metadata"]["namespace"] == "tessera-system" {
                object["metadata"]["namespace"] = "chart-dry-run".into();
            }
            items.push(object);
        }
        // JSON, not re-serialised YAML: kubectl reads YAML 1.1, where `on` is a bool.
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let path = cluster.dir().join("chart-dry-run.json");
        std::fs::write(&path, list.to_string()).unwrap();
        let output = cluster
            .kubectl()
            .unwrap()
            .args(["apply", "--dry-run=server", "-f"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "the API server refuses what the chart renders: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn every_vendor_sections_names_reach_kube_scheduler_and_the_webhook() {
    // Each section as `{}` takes HAMi's names (docs/vendors.md).
    let on: Vec<String> = [
        "hygon",
        "cambricon",
        "mthreads",
        "metax",
        "enflame",
        "kunlun",
        "awsneuron",
        "amd",
    ]
    .iter()
    .map(|s| format!("config.{s}={{}}"))
    .collect();
    let mut extra: Vec<&str> = Vec::new();
    for set in &on {
        extra.extend(["--set-json", set.as_str()]);
    }
    let objects = template(&extra);
    let config = find(&objects, "ConfigMap", "tessera-scheduler");
    let sched: Value =
        serde_yaml_ng::from_str(config["data"]["kube-scheduler.yaml"].as_str().unwrap()).unwrap();
    let managed: BTreeSet<&str> = sched["extenders"][0]["managedResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    let webhook = find(&objects, "MutatingWebhookConfiguration", "tessera");
    let condition = webhook["webhooks"][0]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    for name in [
        "hygon.com/dcunum",
        "cambricon.com/mlu.smlu.vmemory",
        "mthreads.com/sgpu-core",
        "metax-tech.com/gpu",
        "metax-tech.com/sgpu",
        "metax-tech.com/vmemory",
        "metax-tech.com/vcore",
        "enflame.com/gcu",
        "enflame.com/drs-gcu",
        "kunlunxin.com/xpu",
        "kunlunxin.com/vxpu",
        "kunlunxin.com/vxpu-memory",
        "aws.amazon.com/neuron",
        "aws.amazon.com/neuroncore",
        "amd.com/gpu",
        "amd.com/gpumem",
        "amd.com/gpucores",
    ] {
        assert!(managed.contains(name), "{name} not in {managed:?}");
        assert!(
            condition.contains(&format!("'{name}'")),
            "{name}: {condition}"
        );
    }
}
