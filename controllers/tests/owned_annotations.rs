//! The chart's `ValidatingAdmissionPolicy` for scheduler-owned pod
//! annotations (review 2026-12-01, H1), on a real API server with the
//! policy exactly as `helm template` renders it: a tenant may not add,
//! change or remove any key the webhook refuses at creation
//! (`webhook::owned`, one list both are held to here), may change its own
//! keys, and the scheduler's account, cluster administrators and the
//! service accounts of trusted namespaces (other vendors' device plugins)
//! may change them all.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_controllers::webhook::owned::{EXAMPLES_OWNED, EXAMPLES_USER, scheduler_owned};
use tessera_e2e::{ControlPlane, helm};

const NAMESPACE: &str = "tenant-a";
const POD: &str = "p";
const SCHEDULER: &str = "system:serviceaccount:tessera-system:tessera-scheduler";
const PLUGIN: &str = "system:serviceaccount:kube-system:dcu-device-plugin";
const TENANT: &str = "alice";

/// The policy and its binding, as the chart renders them by default.
fn rendered() -> Vec<serde_json::Value> {
    let mut command = helm::command(None).unwrap();
    command
        .args(["template", "tessera", "--namespace", "tessera-system"])
        .arg(helm::chart_dir());
    let objects = helm::objects(&helm::run(&mut command).unwrap()).unwrap();
    let wanted: Vec<serde_json::Value> = objects
        .into_iter()
        .filter(|o| o["metadata"]["name"] == "tessera-pod-owned-annotations")
        .collect();
    assert_eq!(wanted.len(), 2, "the policy and its binding");
    wanted
}

async fn as_user(plane: &ControlPlane, user: &str) -> Client {
    let mut config = plane.client_config().await.unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).unwrap()
}

async fn annotate(client: &Client, key: &str, value: Option<&str>) -> Result<Pod, kube::Error> {
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .patch(
            POD,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
}

#[tokio::test]
async fn only_the_scheduler_and_trusted_writers_change_scheduler_owned_annotations() {
    let plane = ControlPlane::start().await.expect("control plane");
    let admin = plane.client().await.unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await
        .unwrap();
    // Everyone here may patch pods of the namespace; only the policy stands
    // between the tenant and the scheduler's keys.
    let rbac = json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pods", "namespace": NAMESPACE},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "pods", "namespace": NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
         "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT},
            {"kind": "ServiceAccount", "name": "tessera-scheduler", "namespace": "tessera-system"},
            {"kind": "ServiceAccount", "name": "dcu-device-plugin", "namespace": "kube-system"}]},
    ]);
    let mut objects = rendered();
    objects.extend(rbac.as_array().unwrap().iter().cloned());
    for object in objects {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        let types = object.types.clone().unwrap();
        let (group, version) = types.api_version.split_once('/').unwrap();
        let kind = GroupVersionKind::gvk(group, version, &types.kind);
        let (resource, _) = kube::discovery::pinned_kind(&admin, &kind).await.unwrap();
        let api: Api<DynamicObject> = match object.metadata.namespace.as_deref() {
            Some(namespace) => Api::namespaced_with(admin.clone(), namespace, &resource),
            None => Api::all_with(admin.clone(), &resource),
        };
        api.create(&PostParams::default(), &object).await.unwrap();
    }
    Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": POD},
                "spec": {"containers": [{"name": "main", "image": "example.invalid/app"}]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    let tenant = as_user(&plane, TENANT).await;
    // A new policy takes effect once the API server has compiled it; each
    // try writes a new value (writing the value already there is no change).
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let refused = tessera_testkit::eventually(
        "the policy in effect",
        Duration::from_secs(30),
        async || {
            let value = tries
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                .to_string();
            annotate(&tenant, "hami.io/bind-phase", Some(&value))
                .await
                .is_err()
        },
    )
    .await;
    eprintln!("policy in effect after {refused:?}");
    for key in EXAMPLES_OWNED {
        assert!(scheduler_owned(key), "{key}: the webhook's list");
        let error = annotate(&tenant, key, Some("x"))
            .await
            .expect_err(&format!("{key}: the tenant may not set it"));
        assert!(
            error
                .to_string()
                .contains(&format!("metadata.annotations[{key}]")),
            "{key}: {error}"
        );
    }
    for key in EXAMPLES_USER {
        assert!(!scheduler_owned(key), "{key}: the webhook's list");
        annotate(&tenant, key, Some("x"))
            .await
            .unwrap_or_else(|e| panic!("{key}: the tenant's own key: {e}"));
    }
    // The scheduler writes the hand-off, a plugin answers it; the tenant can
    // neither change nor remove the answer.
    let scheduler = as_user(&plane, SCHEDULER).await;
    annotate(&scheduler, "hami.io/bind-phase", Some("allocating"))
        .await
        .expect("the scheduler writes the hand-off");
    annotate(
        &as_user(&plane, PLUGIN).await,
        "hami.io/bind-phase",
        Some("success"),
    )
    .await
    .expect("a vendor plugin in kube-system answers it");
    annotate(&tenant, "hami.io/bind-phase", None)
        .await
        .expect_err("the tenant may not remove it");
    annotate(&admin, "hami.io/bind-phase", None)
        .await
        .expect("an administrator may");
}
