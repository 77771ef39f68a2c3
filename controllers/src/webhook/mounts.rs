//! A GPU pod's own volume mounts must not shadow what the node agent mounts
//! into its containers (review 2026-12-01, M3): the kubelet appends the
//! pod's mounts after the device plugin's and containerd mounts them in
//! order of depth, stably, so a mount of the pod at the same path (or at a
//! file beneath it, through `subPath`) is mounted last and wins. An
//! `emptyDir` at the limits directory undid the limits file (and so the
//! defence against `envFrom`); a `subPath` mount at `/etc/ld.so.preload`
//! turned the interposer off. A mount above these paths (`/etc`,
//! `/var/run`) is mounted first and the agent's on top of it, so it is
//! admitted.

use k8s_openapi::api::core::v1::Container;

/// What the node agent mounts (or mounts under), in the container's view:
/// the preload list, the interposer's directory, the region and limits
/// directories; `/run/tessera` too, where images make `/var/run` a link to
/// `/run`.
const GUARDED: &[&str] = &[
    "/etc/ld.so.preload",
    "/usr/local/vgpu",
    "/var/run/tessera",
    "/run/tessera",
];

/// The refusal for the first mount of `container` at or under a guarded
/// path, naming the container, the mount and the path.
pub fn refusal(container: &Container) -> Option<String> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .enumerate()
        .find_map(|(index, mount)| {
            let why = shadows(&mount.mount_path)?;
            Some(format!(
                "container {:?}: volumeMounts[{index}] ({:?}) mountPath {:?} {why}; the node agent mounts the GPU slice's limits and the interposer there, and a mount of the pod would hide them",
                container.name, mount.name, mount.mount_path
            ))
        })
}

/// Why a mount at `path` would hide one of the agent's, if it would.
fn shadows(path: &str) -> Option<String> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Some("contains '..'".into());
    }
    GUARDED.iter().find_map(|guarded| {
        let inside: Vec<&str> = guarded.split('/').filter(|p| !p.is_empty()).collect();
        parts
            .starts_with(&inside)
            .then(|| format!("is {guarded} or lies under it"))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn container(path: &str) -> Container {
        serde_json::from_value(json!({"name": "main", "volumeMounts": [
            {"name": "ok", "mountPath": "/data"},
            {"name": "sneaky", "mountPath": path}]}))
        .unwrap()
    }

    #[test]
    fn mounts_at_or_under_the_agents_paths_are_refused_naming_them() {
        for path in [
            "/var/run/tessera/limits",
            "/var/run/tessera/limits/",
            "/var/run/tessera/limits/limits.env",
            "//var/run/./tessera/vgpu",
            "/var/run/tessera",
            "/run/tessera/limits/limits.env",
            "/etc/ld.so.preload",
            "/usr/local/vgpu/libtessera_vgpu.so",
            "/var/run/../run/tessera",
        ] {
            let message = refusal(&container(path)).unwrap_or_else(|| panic!("{path}"));
            assert!(
                message.starts_with("container \"main\": volumeMounts[1] (\"sneaky\")"),
                "{message}"
            );
        }
    }

    #[test]
    fn mounts_elsewhere_or_above_are_admitted() {
        for path in [
            "/etc",
            "/var/run",
            "/run",
            "/var/run/tesserae",
            "/etc/ld.so.conf.d",
            "/usr/local",
        ] {
            assert_eq!(refusal(&container(path)), None, "{path}");
        }
    }
}
