//! Pod manifests the tests and the cluster harness share (no cluster
//! needed to build one).

use serde_json::{Value, json};

use crate::images;

/// A bare pod in `default` running `script` in the CUDA demo image, with one
/// GPU, `mem_mib` of its memory and, when given, `cores` percent of its SMs.
pub fn gpu_pod(name: &str, mem_mib: u64, cores: Option<u32>, script: &str) -> Value {
    let mut limits = json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem_mib});
    if let Some(cores) = cores {
        limits["nvidia.com/gpucores"] = json!(cores);
    }
    pod_with_limits(name, limits, script)
}

/// A bare pod in `default` running `script` in the CUDA demo image, its one
/// container with `limits` (any family's resources).
pub fn pod_with_limits(name: &str, limits: Value, script: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "cuda", "image": images::CUDA_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "resources": {"limits": limits},
            }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_pod_asks_for_cores_only_when_given() {
        let limits = |pod: Value| pod["spec"]["containers"][0]["resources"]["limits"].clone();
        assert_eq!(
            limits(gpu_pod("p", 512, None, "true")),
            json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 512})
        );
        assert_eq!(
            limits(gpu_pod("p", 512, Some(30), "true"))["nvidia.com/gpucores"],
            30
        );
    }
}
