//! The agent's liveness Lease `tessera-agent-<node>`: created on start,
//! renewed every `LEASE_SECONDS / 4`, deleted on a clean stop, and owned so
//! that the garbage collector removes it when the agent cannot.
//!
//! The agent cannot always delete it: `helm uninstall` deletes the agent's
//! RBAC and service account in the same sweep as its DaemonSet, so by the
//! time the kubelet stops the pod the agent may no longer write anything.
//! A Lease in the agent pod's own namespace is owned by the pod (owners
//! must share the dependent's namespace) and goes with it; elsewhere it is
//! owned by the Node, as the GpuNode is.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::Lease,
    apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{Error, publish};

/// How long the Lease says the agent is alive without renewing.
pub const LEASE_SECONDS: i32 = 40;

/// Which Lease the agent keeps and who owns it.
#[derive(Clone, Debug)]
pub struct LeaseSite {
    /// The namespace of the Lease.
    pub namespace: String,
    /// The agent's node; the Lease is `tessera-agent-<node>`.
    pub node: String,
    /// The agent's own pod as an owner, when it runs in a pod in
    /// `namespace` (see [`pod_owner`]); otherwise the Node owns the Lease.
    pub pod: Option<OwnerReference>,
}

impl LeaseSite {
    /// The Lease's name.
    pub fn name(&self) -> String {
        format!("tessera-agent-{}", self.node)
    }
}

/// The agent's pod as the owner of a Lease in `lease_namespace`: only when
/// the pod's name, namespace and UID are all known (the chart passes them
/// from the downward API) and the pod lives in that namespace, since an
/// owner in another namespace is ignored by the garbage collector.
pub fn pod_owner(
    name: Option<&str>,
    namespace: Option<&str>,
    uid: Option<&str>,
    lease_namespace: &str,
) -> Option<OwnerReference> {
    let (Some(name), Some(namespace), Some(uid)) = (name, namespace, uid) else {
        return None;
    };
    (namespace == lease_namespace && !name.is_empty() && !uid.is_empty()).then(|| OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(false),
        block_owner_deletion: None,
    })
}

/// Renews the Lease every `LEASE_SECONDS / 4`: liveness without status
/// rewrites.
///
/// When a renewal succeeds after the Lease may have lapsed meanwhile (the
/// agent was cut off or stalled for longer than the Lease lasts), the
/// lifecycle controller may have marked the GpuNode `Ready=Unknown`:
/// `lapsed` is notified so [`publish::gpu_node`] writes its status again at
/// once.
pub async fn keep(
    client: Client,
    site: LeaseSite,
    identity: String,
    lapsed: std::sync::Arc<tokio::sync::Notify>,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &site.namespace);
    let name = site.name();
    let every = Duration::from_secs(u64::try_from(LEASE_SECONDS / 4).unwrap_or(10));
    let mut last_renewed: Option<tokio::time::Instant> = None;
    loop {
        match renew(&client, &api, &site, &identity).await {
            Ok(()) => {
                let now = tokio::time::Instant::now();
                if lapsed_meanwhile(last_renewed.map(|t| now - t)) {
                    tracing::info!(lease = %name, "the agent Lease may have lapsed; writing the GpuNode again");
                    lapsed.notify_one();
                }
                last_renewed = Some(now);
            }
            Err(error) => tracing::warn!(%error, lease = %name, "renewing the agent Lease failed"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Whether a Lease renewed `since_last` after its previous renewal may have
/// lapsed in between (the first renewal of a process: no).
fn lapsed_meanwhile(since_last: Option<Duration>) -> bool {
    since_last.is_some_and(|d| d >= Duration::from_secs(u64::try_from(LEASE_SECONDS).unwrap_or(40)))
}

/// Deletes the Lease (the agent stops cleanly: its GpuNode says
/// `AgentStopping`, and nothing should wait for the Lease to lapse). Stop
/// [`keep`]'s task first.
pub async fn delete(client: &Client, site: &LeaseSite) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &site.namespace);
    let name = site.name();
    match api.delete(&name, &Default::default()).await {
        Ok(_) => tracing::info!(lease = %name, "agent Lease deleted"),
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(error) => tracing::warn!(lease = %name, %error, "could not delete the agent Lease"),
    }
}

/// The owner the Lease should have now: the pod, or the Node once the
/// kubelet has registered it.
async fn wanted_owner(client: &Client, site: &LeaseSite) -> Result<Option<OwnerReference>, Error> {
    match &site.pod {
        Some(pod) => Ok(Some(pod.clone())),
        None => publish::owner(client, &site.node).await,
    }
}

/// Whether `current` already names `wanted` (by UID) and nothing else.
fn owned_as_wanted(current: Option<&[OwnerReference]>, wanted: &OwnerReference) -> bool {
    matches!(current, Some([only]) if only.uid == wanted.uid)
}

async fn renew(
    client: &Client,
    api: &Api<Lease>,
    site: &LeaseSite,
    identity: &str,
) -> Result<(), Error> {
    let name = site.name();
    let now = MicroTime(Timestamp::now());
    let spec = json!({
        "holderIdentity": identity,
        "leaseDurationSeconds": LEASE_SECONDS,
        "renewTime": now,
    });
    if let Some(existing) = api
        .get_opt(&name)
        .await
        .map_err(Error::kube("reading the agent Lease"))?
    {
        let mut patch = json!({ "spec": spec });
        // Created before the kubelet registered the Node, or by the pod this
        // one replaces: owned by the right object from now on.
        if let Some(owner) = wanted_owner(client, site).await?
            && !owned_as_wanted(existing.metadata.owner_references.as_deref(), &owner)
        {
            patch["metadata"] = json!({"ownerReferences": [owner]});
        }
        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(Error::kube("renewing the agent Lease"))?;
        return Ok(());
    }
    let owner = wanted_owner(client, site).await?;
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": owner.map(|o| vec![o]).unwrap_or_default()},
        "spec": spec,
    }))
    .map_err(|e| Error::Io {
        context: "building the agent Lease".into(),
        source: std::io::Error::other(e),
    })?;
    api.create(&PostParams::default(), &lease)
        .await
        .map_err(Error::kube("creating the agent Lease"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_after_a_gap_as_long_as_the_lease_rewrites_the_gpunode() {
        assert!(!lapsed_meanwhile(None), "the first renewal");
        assert!(!lapsed_meanwhile(Some(Duration::from_secs(10))));
        assert!(!lapsed_meanwhile(Some(Duration::from_secs(39))));
        assert!(lapsed_meanwhile(Some(Duration::from_secs(40))));
        assert!(lapsed_meanwhile(Some(Duration::from_secs(300))));
    }

    #[test]
    fn the_pod_owns_the_lease_only_in_its_own_namespace() {
        let owner = pod_owner(Some("agent-x"), Some("tessera"), Some("u-1"), "tessera").unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "agent-x", "u-1")
        );
        assert_eq!(owner.controller, Some(false));
        // An owner in another namespace would be ignored by the garbage
        // collector: the Node owns the Lease instead.
        assert!(
            pod_owner(
                Some("agent-x"),
                Some("tessera"),
                Some("u-1"),
                "kube-node-lease"
            )
            .is_none()
        );
        assert!(pod_owner(None, Some("tessera"), Some("u-1"), "tessera").is_none());
        assert!(pod_owner(Some("agent-x"), Some("tessera"), None, "tessera").is_none());
        assert!(pod_owner(Some("agent-x"), Some("tessera"), Some(""), "tessera").is_none());
    }

    #[test]
    fn a_lease_of_the_replaced_pod_or_of_no_one_is_taken_over() {
        let of = |uid: &str| OwnerReference {
            uid: uid.into(),
            ..Default::default()
        };
        let wanted = of("new");
        assert!(owned_as_wanted(Some(&[of("new")]), &wanted));
        assert!(!owned_as_wanted(Some(&[of("old")]), &wanted));
        assert!(!owned_as_wanted(Some(&[of("new"), of("node")]), &wanted));
        assert!(!owned_as_wanted(Some(&[]), &wanted));
        assert!(!owned_as_wanted(None, &wanted));
    }
}
