//! What the webhook does to a pod: pure, testable without HTTP.

use k8s_openapi::{
    api::core::v1::{Container, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use tessera_scheduling::request::{MemoryRequest, PodRequest, parse_pod};

use crate::{config::Config, engine::quota, extender::OVER_QUOTA};

/// The default scheduler's name; pods naming it are moved to Tessera's.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The webhook's decision for one pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Not a GPU pod: admitted untouched.
    Untouched,
    /// A GPU pod, admitted as this (defaults filled, scheduler set).
    Mutated(Box<Pod>),
    /// Refused, with the message the user sees.
    Denied(String),
}

/// Validates a pod's GPU request, fills HAMi's defaults and sets the scheduler.
///
/// `largest_device_mib` is the largest GPU the cluster has (when known), so a
/// request no GPU can ever satisfy is refused now rather than left Pending;
/// `quota` is the pod's namespace's device limits and what its pods hold, so
/// a pod that cannot fit them wherever it goes is refused now too.
pub fn mutate(
    pod: &Pod,
    config: &Config,
    largest_device_mib: Option<u64>,
    quota: &NamespaceQuota,
) -> Verdict {
    let request = match parse_pod(pod, &config.request) {
        Ok(None) => return Verdict::Untouched,
        Ok(Some(request)) => request,
        Err(error) => return Verdict::Denied(error.to_string()),
    };
    if let Some(refusal) = super::owned::refusal(pod) {
        return Verdict::Denied(refusal);
    }
    let spec = pod.spec.clone().unwrap_or_default();
    if let Some(node) = &spec.node_name {
        return Verdict::Denied(format!(
            "spec.nodeName is set to {node:?}: a GPU pod must be placed by {} so its GPU slices are recorded; remove spec.nodeName",
            config.scheduler_name
        ));
    }
    match spec.scheduler_name.as_deref() {
        None | Some(DEFAULT_SCHEDULER) => {}
        Some(name) if name == config.scheduler_name => {}
        Some(other) => {
            return Verdict::Denied(format!(
                "spec.schedulerName is {other:?}: GPU pods must be scheduled by {} (or leave schedulerName unset)",
                config.scheduler_name
            ));
        }
    }
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    if let Some(privileged) = all.clone().find(|c| is_privileged(c)) {
        return Verdict::Denied(format!(
            "container {:?}: securityContext.privileged sees every GPU on the node and escapes GPU slicing; a pod asking for GPU slices may not run privileged containers",
            privileged.name
        ));
    }
    if let Some(denial) = all.clone().find_map(super::mounts::refusal) {
        return Verdict::Denied(denial);
    }
    if !config.allow_enforcement_env
        && let Some(denial) = all.clone().find_map(enforcement_env)
    {
        return Verdict::Denied(denial);
    }
    if let Some(largest) = largest_device_mib
        && let Some(too_big) = request
            .containers
            .iter()
            .filter(|c| c.family.is_nvidia())
            .find(|c| matches!(c.memory, MemoryRequest::Mib(m) if m > largest))
    {
        return Verdict::Denied(format!(
            "container {:?}: {}: {} MiB is more than any GPU in the cluster offers (largest: {largest} MiB)",
            too_big.name,
            config.request.resources.memory,
            too_big.memory.resolve(0),
        ));
    }

    if let Err(over) = quota::check(
        &quota.limits,
        &quota.used,
        &quota::least_charge(&request, &quota::names(&request, &config.request)),
    ) {
        return Verdict::Denied(format!("{OVER_QUOTA}{over}"));
    }

    let mut mutated = pod.clone();
    fill_defaults(&mut mutated, &request, config);
    config
        .request
        .families()
        .admit_pod(&mut mutated, &request.containers);
    let spec = mutated.spec.get_or_insert_default();
    spec.scheduler_name = Some(config.scheduler_name.clone());
    Verdict::Mutated(Box::new(mutated))
}

/// A namespace's device limits and what its pods hold against them.
#[derive(Clone, Debug, Default)]
pub struct NamespaceQuota {
    /// The limits of its ResourceQuotas.
    pub limits: quota::Limits,
    /// What its live allocations count.
    pub used: quota::Charge,
}

/// Writes the defaults HAMi's webhook writes: the GPU count where only memory
/// or cores were given, and 100 cores for a whole-device request.
fn fill_defaults(pod: &mut Pod, request: &PodRequest, config: &Config) {
    let names = &config.request.resources;
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    let families = config.request.families();
    for container in containers {
        families.admit_container(container, &request.containers);
        let Some(wanted) = request
            .containers
            .iter()
            .find(|r| r.name == container.name && r.family.is_nvidia())
        else {
            continue;
        };
        let resources = container.resources.get_or_insert_default();
        let explicit = |key: &str, r: &k8s_openapi::api::core::v1::ResourceRequirements| {
            r.limits.as_ref().is_some_and(|l| l.contains_key(key))
                || r.requests.as_ref().is_some_and(|l| l.contains_key(key))
        };
        let mut add = Vec::new();
        if !explicit(&names.count, resources) {
            add.push((names.count.clone(), wanted.count.to_string()));
        }
        if !explicit(&names.cores, resources) && wanted.cores == 100 {
            add.push((names.cores.clone(), "100".to_owned()));
        }
        for (key, value) in add {
            resources
                .limits
                .get_or_insert_default()
                .insert(key.clone(), Quantity(value.clone()));
            if let Some(requests) = resources.requests.as_mut() {
                requests.insert(key, Quantity(value));
            }
        }
    }
}

/// The refusal for a container that sets a variable the node agent enforces
/// its slice with, naming the first one.
fn enforcement_env(container: &Container) -> Option<String> {
    let (index, var) = container
        .env
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, var)| tessera_api::env::is_enforcement_var(&var.name))?;
    Some(format!(
        "container {:?}: env[{index}] {}: the node agent sets this variable to enforce the container's GPU slice, and a value set here would override it; remove it (the controller's allowEnforcementEnv lets pods set it)",
        container.name, var.name
    ))
}

fn is_privileged(container: &Container) -> bool {
    container
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    use super::*;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "d"}, "spec": spec}))
            .unwrap()
    }

    fn gpu_pod(limits: Value) -> Pod {
        pod(json!({"containers": [{"name": "main", "resources": {"limits": limits}}]}))
    }

    fn mutated(verdict: Verdict) -> Value {
        match verdict {
            Verdict::Mutated(pod) => serde_json::to_value(pod).unwrap(),
            other => panic!("expected a mutation, got {other:?}"),
        }
    }

    fn denied(verdict: Verdict) -> String {
        match verdict {
            Verdict::Denied(message) => message,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn pods_without_gpus_are_untouched() {
        let plain = pod(
            json!({"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}], "nodeName": "n"}),
        );
        assert_eq!(
            mutate(&plain, &Config::default(), None, &NamespaceQuota::default()),
            Verdict::Untouched
        );
    }

    #[test]
    fn gpu_pods_get_the_scheduler_and_hami_defaults() {
        let out = mutated(mutate(
            &gpu_pod(json!({"nvidia.com/gpumem": "3000"})),
            &Config::default(),
            Some(81920),
            &NamespaceQuota::default(),
        ));
        assert_eq!(out["spec"]["schedulerName"], "tessera-scheduler");
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpumem": "3000", "nvidia.com/gpu": "1"})
        );

        let whole = mutated(mutate(
            &gpu_pod(json!({"nvidia.com/gpu": "2"})),
            &Config::default(),
            None,
            &NamespaceQuota::default(),
        ));
        assert_eq!(
            whole["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"})
        );

        let explicit = gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}));
        let same = mutated(mutate(
            &explicit,
            &Config::default(),
            None,
            &NamespaceQuota::default(),
        ));
        assert_eq!(
            same["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"})
        );
    }

    #[test]
    fn refusals_name_the_field_and_the_rule() {
        let cases = [
            (
                gpu_pod(json!({"nvidia.com/gpumem": "1", "nvidia.com/gpumem-percentage": "5"})),
                "cannot be combined with nvidia.com/gpumem-percentage",
            ),
            (
                gpu_pod(json!({"nvidia.com/gpucores": "150"})),
                "nvidia.com/gpucores: must be between 0 and 100, got 150",
            ),
            (
                gpu_pod(json!({"nvidia.com/gpumem": "200000"})),
                "200000 MiB is more than any GPU in the cluster offers (largest: 81920 MiB)",
            ),
            (
                pod(
                    json!({"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
                ),
                "spec.nodeName is set",
            ),
            (
                pod(
                    json!({"schedulerName": "volcano", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
                ),
                "spec.schedulerName is \"volcano\"",
            ),
            (
                pod(json!({"containers": [
                    {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "debug", "securityContext": {"privileged": true}},
                ]})),
                "container \"debug\": securityContext.privileged",
            ),
        ];
        for (pod, needle) in cases {
            let message = denied(mutate(
                &pod,
                &Config::default(),
                Some(81920),
                &NamespaceQuota::default(),
            ));
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
    }

    #[test]
    fn a_gpu_pod_may_not_set_the_variables_that_enforce_its_slice() {
        let setting = |container: &str, env: Value| {
            pod(json!({"containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}},
                {"name": container, "env": env},
            ]}))
        };
        let lifting = setting(
            "side",
            json!([{"name": "HOME", "value": "/"}, {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}]),
        );
        assert_eq!(
            denied(mutate(
                &lifting,
                &Config::default(),
                None,
                &NamespaceQuota::default()
            )),
            "container \"side\": env[1] CUDA_DEVICE_MEMORY_LIMIT_0: the node agent sets this variable to enforce the container's GPU slice, and a value set here would override it; remove it (the controller's allowEnforcementEnv lets pods set it)"
        );
        let disabling = setting(
            "side",
            json!([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
        );
        assert!(
            denied(mutate(
                &disabling,
                &Config::default(),
                None,
                &NamespaceQuota::default()
            ))
            .contains("env[0] CUDA_DISABLE_CONTROL")
        );

        let allowed = Config {
            allow_enforcement_env: true,
            ..Config::default()
        };
        mutated(mutate(&lifting, &allowed, None, &NamespaceQuota::default()));
        let harmless = setting("side", json!([{"name": "LIBCUDA_LOG_LEVEL", "value": "4"}]));
        mutated(mutate(
            &harmless,
            &Config::default(),
            None,
            &NamespaceQuota::default(),
        ));
        // Pods without GPUs may set anything.
        let plain = pod(
            json!({"containers": [{"name": "c", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "1"}]}]}),
        );
        assert_eq!(
            mutate(&plain, &Config::default(), None, &NamespaceQuota::default()),
            Verdict::Untouched
        );
    }
}
