//! The Helm chart installed with `helm install` on a real API server (no
//! nodes; the real-node tests run it with pods): each service account's
//! effective permissions against the table in `e2e/tests/rbac/`, the node
//! agent confined to its own node by the admission policy, and the webhook
//! certificate kept across upgrades, renewed near expiry and removed with
//! everything else on uninstall (the CRDs and the guard refusing GPU pods
//! while Tessera is absent stay).

use std::{path::Path, process::Command};

use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    coordination::v1::Lease,
    core::v1::{Namespace, Node, Pod, Secret},
    rbac::v1::ClusterRole,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_api::v1alpha1::{GpuNode, GpuNodeSpec};
use tessera_e2e::{ControlPlane, helm};
use tokio::sync::OnceCell;

const NAMESPACE: &str = "tessera-system";
const ACCOUNTS: [&str; 2] = ["tessera-scheduler", "tessera-node-agent"];
const NAMESPACES: [&str; 4] = [NAMESPACE, "kube-system", "kube-node-lease", "default"];

/// `helm install tessera` into [`NAMESPACE`], once per test binary.
async fn installed() -> &'static ControlPlane {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let cluster = tessera_e2e::shared().await.unwrap();
    INSTALLED
        .get_or_init(|| async {
            install(cluster, "tessera", NAMESPACE, &[]);
        })
        .await;
    cluster
}

fn install(cluster: &ControlPlane, release: &str, namespace: &str, extra: &[&str]) -> String {
    let mut command = helm::command(Some(cluster.kubeconfig())).unwrap();
    command
        .args(["upgrade", "--install", release])
        .arg(helm::chart_dir())
        .args(["--namespace", namespace, "--create-namespace"])
        .args(extra);
    helm::run(&mut command).unwrap()
}

fn kubectl(cluster: &ControlPlane, args: &[&str]) -> String {
    let output = cluster.kubectl().unwrap().args(args).output().unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// One line of `kubectl auth can-i --list`, with single spaces and the words
/// inside each `[...]` sorted: when several rules grant one resource, kubectl
/// merges their verbs in no fixed order.
fn normalize(line: &str) -> String {
    let mut out = Vec::new();
    let mut group: Option<Vec<String>> = None;
    for word in line.split_whitespace() {
        match &mut group {
            Some(words) => words.push(word.to_owned()),
            None if word.starts_with('[') => group = Some(vec![word.to_owned()]),
            None => out.push(word.to_owned()),
        }
        if word.ends_with(']')
            && let Some(words) = group.take()
        {
            let joined = words.join(" ");
            let mut items: Vec<&str> = joined
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split_whitespace()
                .collect();
            items.sort_unstable();
            out.push(format!("[{}]", items.join(" ")));
        }
    }
    out.join(" ")
}

/// What `kubectl auth can-i --list` says `account` may do, per namespace.
fn permissions(cluster: &ControlPlane, account: &str) -> String {
    let mut table = format!(
        "# kubectl auth can-i --list --as=system:serviceaccount:{NAMESPACE}:{account} -n <namespace>\n\
         # Checked by e2e/tests/chart_install.rs; after a deliberate RBAC change, rerun it with\n\
         # TESSERA_BLESS_RBAC=1 and review the diff.\n"
    );
    for namespace in NAMESPACES {
        let user = format!("--as=system:serviceaccount:{NAMESPACE}:{account}");
        let listed = kubectl(
            cluster,
            &["auth", "can-i", "--list", &user, "-n", namespace],
        );
        let mut lines: Vec<String> = listed.lines().map(normalize).collect();
        let header = lines.remove(0);
        lines.sort();
        table.push_str(&format!("\n## namespace {namespace}\n{header}\n"));
        for line in lines {
            table.push_str(&line);
            table.push('\n');
        }
    }
    table
}

#[tokio::test]
async fn service_accounts_have_exactly_the_permissions_in_the_table() {
    let cluster = installed().await;
    let dir = tessera_e2e::tools::repo_root().join("e2e/tests/rbac");
    let bless = std::env::var_os("TESSERA_BLESS_RBAC").is_some();
    for account in ACCOUNTS {
        let actual = permissions(cluster, account);
        let path = dir.join(format!("{account}.txt"));
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        pretty_assertions::assert_eq!(
            expected,
            actual,
            "{account}'s effective permissions differ from {}; if the change is deliberate, \
             rerun with TESSERA_BLESS_RBAC=1 and commit the table",
            path.display()
        );
    }
}

/// A client authenticating with `token` instead of the admin's.
async fn client_with_token(cluster: &ControlPlane, token: &str) -> Client {
    let mut config = cluster.client_config().await.unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_owned().into()),
        ..Default::default()
    };
    Client::try_from(config).unwrap()
}

fn token(cluster: &ControlPlane, bound_pod: Option<&str>) -> String {
    let mut args = vec!["create", "token", "tessera-node-agent", "-n", NAMESPACE];
    if let Some(pod) = bound_pod {
        args.extend(["--bound-object-kind", "Pod", "--bound-object-name", pod]);
    }
    kubectl(cluster, &args).trim().to_owned()
}

async fn node(client: &Client, name: &str) {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("creating node {name}: {error}"),
    }
}

fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, needle: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains(needle),
                "refused, but not with {needle:?}: {}",
                status.message
            );
        }
        other => panic!("expected a refusal naming {needle:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn node_agent_writes_only_its_own_node() {
    let cluster = installed().await;
    let admin = cluster.client().await.unwrap();
    for name in ["agent-node-a", "agent-node-b"] {
        node(&admin, name).await;
    }
    // The agent's pod on agent-node-a (bound directly: no scheduler needed).
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "agent-on-a"},
        "spec": {
            "nodeName": "agent-node-a",
            "serviceAccountName": "tessera-node-agent",
            "containers": [{"name": "agent", "image": "example.invalid/agent"}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let agent = client_with_token(cluster, &token(cluster, Some("agent-on-a"))).await;

    let gpu_node = |name: &str| GpuNode::new(name, GpuNodeSpec {});
    let gpu_nodes: Api<GpuNode> = Api::all(agent.clone());
    // The API server enforces a ValidatingAdmissionPolicy once its policy
    // informer has the policy and its binding, a moment after `helm install`
    // (seconds on a loaded machine). Wait for that with a dry run, as an
    // operator checking the install would, before testing what it refuses.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while gpu_nodes
        .create(&dry_run, &gpu_node("agent-node-b"))
        .await
        .is_ok()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the node agent admission policy was not enforced within 60 s of helm install"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    gpu_nodes
        .create(&PostParams::default(), &gpu_node("agent-node-a"))
        .await
        .expect("the agent publishes its own GpuNode");
    refused(
        gpu_nodes
            .create(&PostParams::default(), &gpu_node("agent-node-b"))
            .await,
        "the node agent of agent-node-a may not write gpunodes agent-node-b",
    );

    let nodes: Api<Node> = Api::all(agent.clone());
    let annotate = |value: &str| {
        Patch::Merge(json!({"metadata": {"annotations": {"tessera.dev/gpu-ready": value}}}))
    };
    nodes
        .patch("agent-node-a", &PatchParams::default(), &annotate("True"))
        .await
        .expect("the agent announces readiness on its Node");
    refused(
        nodes
            .patch("agent-node-b", &PatchParams::default(), &annotate("True"))
            .await,
        "may not write nodes agent-node-b",
    );
    refused(
        nodes
            .patch(
                "agent-node-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"gpu": "off"}}})),
            )
            .await,
        "only the tessera.dev/gpu-ready annotation",
    );
    refused(
        nodes
            .patch(
                "agent-node-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await,
        "only the tessera.dev/gpu-ready annotation",
    );

    let lease = |name: &str| -> Lease {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"holderIdentity": "agent"}}),
        )
        .unwrap()
    };
    let leases: Api<Lease> = Api::namespaced(agent.clone(), NAMESPACE);
    leases
        .create(&PostParams::default(), &lease("tessera-agent-agent-node-a"))
        .await
        .expect("the agent keeps its own Lease");
    refused(
        leases
            .create(&PostParams::default(), &lease("tessera-agent-agent-node-b"))
            .await,
        "may write only the Lease tessera-agent-agent-node-a",
    );
    // The agents' Leases share the release namespace with the scheduler
    // pods' leader-election Leases, which RBAC alone would let them take.
    // (No scheduler pod runs here: the Lease is made as the controller would.)
    let controller_leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    if controller_leases
        .get_opt("tessera-controller")
        .await
        .unwrap()
        .is_none()
    {
        controller_leases
            .create(&PostParams::default(), &lease("tessera-controller"))
            .await
            .unwrap();
    }
    refused(
        leases
            .patch(
                "tessera-controller",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": "agent"}})),
            )
            .await,
        "may write only the Lease tessera-agent-agent-node-a",
    );
    // RBAC alone: the agent may not touch Leases elsewhere at all.
    refused(
        Api::<Lease>::namespaced(agent.clone(), "kube-system")
            .create(&PostParams::default(), &lease("tessera-agent-agent-node-a"))
            .await,
        "forbidden",
    );

    // The DRA door: its own node's ResourceSlice of Tessera's driver only.
    let slice = |node: &str, driver: &str| -> k8s_openapi::api::resource::v1::ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-{driver}")},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }))
        .unwrap()
    };
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(agent.clone());
    slices
        .create(&dry_run, &slice("agent-node-a", "gpu.tessera.dev"))
        .await
        .expect("the agent publishes its own node's slice");
    for (node, driver) in [
        ("agent-node-b", "gpu.tessera.dev"),
        ("agent-node-a", "gpu.nvidia.com"),
    ] {
        refused(
            slices.create(&dry_run, &slice(node, driver)).await,
            "may write only the ResourceSlices of driver gpu.tessera.dev on its own node",
        );
    }

    // Allocations: another node's pod allocation is out of reach, but the
    // mirror another node left of a DRA claim may be deleted (the agent
    // preparing the claim anew replaces it).
    let allocations: Api<tessera_api::v1alpha1::VgpuAllocation> =
        Api::namespaced(admin.clone(), "default");
    let on_b = |name: &str| {
        let slice = tessera_api::testing::slice("GPU-b-0", 0, 1024, 0);
        let built = tessera_api::testing::allocation(name, "uid-b", "agent-node-b")
            .container(tessera_api::testing::container("cuda", vec![slice]));
        if name.starts_with("claim-") {
            built.claim("claim-b", "b0b0").build()
        } else {
            built.build()
        }
    };
    for allocation in [on_b("pod-on-b"), on_b("claim-b0b0")] {
        allocations
            .create(&PostParams::default(), &allocation)
            .await
            .unwrap();
    }
    let as_agent: Api<tessera_api::v1alpha1::VgpuAllocation> =
        Api::namespaced(agent.clone(), "default");
    let delete_dry = kube::api::DeleteParams {
        dry_run: true,
        ..kube::api::DeleteParams::default()
    };
    refused(
        as_agent.delete("pod-on-b", &delete_dry).await,
        "may not write the allocation of a pod on agent-node-b",
    );
    as_agent
        .delete("claim-b0b0", &delete_dry)
        .await
        .expect("the mirror of a claim another node left may be deleted");

    // A token of the agent's account not bound to a pod on a node writes nothing.
    let unbound = client_with_token(cluster, &token(cluster, None)).await;
    refused(
        Api::<Node>::all(unbound)
            .patch("agent-node-a", &PatchParams::default(), &annotate("False"))
            .await,
        "not bound to a pod on a node",
    );
}

fn webhook_tls(secret: &Secret) -> (String, String) {
    let data = secret.data.as_ref().unwrap();
    let text = |key: &str| String::from_utf8(data[key].0.clone()).unwrap();
    (text("ca.crt"), text("tls.crt"))
}

fn verify(dir: &Path, ca: &str, cert: &str, name: &str) {
    let (ca_path, cert_path) = (dir.join("ca.crt"), dir.join("tls.crt"));
    std::fs::write(&ca_path, ca).unwrap();
    std::fs::write(&cert_path, cert).unwrap();
    let output = Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(&ca_path)
        .arg("-verify_hostname")
        .arg(name)
        .arg(&cert_path)
        .output()
        .expect("openssl runs");
    assert!(
        output.status.success(),
        "the webhook certificate does not verify for {name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn webhook_certificate_is_kept_on_upgrade_renewed_near_expiry_and_removed_on_uninstall() {
    let cluster = tessera_e2e::shared().await.unwrap();
    let client = cluster.client().await.unwrap();
    let (release, namespace) = ("certs", "certs-system");
    // The scheduler pods may take their leader-election Leases before helm
    // has created everything: the install must not trip over them.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let taken = |name: &str| -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": "certs-tessera-scheduler-0"},
        }))
        .unwrap()
    };
    for name in ["certs-tessera-scheduler", "tessera-controller"] {
        leases
            .create(&PostParams::default(), &taken(name))
            .await
            .unwrap();
    }
    // A second release in the cluster: the first one holds the DeviceClass
    // (cluster-scoped, and its name is what claims ask for).
    const SECOND: [&str; 2] = ["--set", "dra.deviceClass=false"];
    install(cluster, release, namespace, &SECOND);

    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = |config: &MutatingWebhookConfiguration| {
        let bytes = config.webhooks.as_ref().unwrap()[0]
            .client_config
            .ca_bundle
            .clone()
            .unwrap();
        String::from_utf8(bytes.0).unwrap()
    };
    let (ca, cert) = webhook_tls(&secrets.get("certs-tessera-webhook-tls").await.unwrap());
    assert_eq!(bundle(&webhooks.get("certs-tessera").await.unwrap()), ca);
    let dir = tempfile::tempdir().unwrap();
    verify(
        dir.path(),
        &ca,
        &cert,
        "certs-tessera-controller.certs-system.svc",
    );

    // An upgrade changing an unrelated value keeps the certificate.
    install(
        cluster,
        release,
        namespace,
        &[&SECOND[..], &["--set", "config.defaultCores=10"]].concat(),
    );
    let kept = webhook_tls(&secrets.get("certs-tessera-webhook-tls").await.unwrap());
    assert_eq!(
        kept,
        (ca.clone(), cert.clone()),
        "an upgrade replaced a valid certificate"
    );

    // Within renewBeforeDays of expiry, the next upgrade issues new ones and
    // the registration carries the new CA.
    install(
        cluster,
        release,
        namespace,
        &[
            &SECOND[..],
            &["--set", "webhook.certificate.renewBeforeDays=400"],
        ]
        .concat(),
    );
    let (new_ca, new_cert) = webhook_tls(&secrets.get("certs-tessera-webhook-tls").await.unwrap());
    assert_ne!(new_cert, cert, "a certificate near expiry was not renewed");
    assert_eq!(
        bundle(&webhooks.get("certs-tessera").await.unwrap()),
        new_ca
    );
    verify(
        dir.path(),
        &new_ca,
        &new_cert,
        "certs-tessera-controller.certs-system.svc",
    );

    // Uninstall: the registration, the policy and the cluster roles go; the CRDs stay.
    let mut command = helm::command(Some(cluster.kubeconfig())).unwrap();
    command.args(["uninstall", release, "--namespace", namespace, "--wait"]);
    helm::run(&mut command).unwrap();
    assert!(webhooks.get_opt("certs-tessera").await.unwrap().is_none());
    for name in ["certs-tessera-scheduler", "tessera-controller"] {
        assert!(
            leases.get_opt(name).await.unwrap().is_none(),
            "the leader-election Lease {name} outlived the release"
        );
    }
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .get_opt("certs-tessera-node-agent")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        secrets
            .get_opt("certs-tessera-webhook-tls")
            .await
            .unwrap()
            .is_none()
    );
    let policies = kubectl(
        cluster,
        &["get", "validatingadmissionpolicies", "-o", "name"],
    );
    // The guard refusing GPU pods while Tessera is absent stays, as the CRDs do.
    assert!(
        !policies.contains("certs-tessera-node-agent-own-node"),
        "{policies}"
    );
    assert!(
        policies.contains("certs-tessera-gpu-pods-need-tessera"),
        "{policies}"
    );
    let crds = kubectl(cluster, &["get", "crds", "-o", "name"]);
    for crd in ["gpunodes", "vgpuallocations", "nodelocks", "gpunodeconfigs"] {
        assert!(crds.contains(&format!("{crd}.tessera.dev")), "{crds}");
    }
}
