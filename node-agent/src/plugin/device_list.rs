//! How Allocate tells the container runtime which GPUs a container gets:
//! the strategies of NVIDIA's k8s-device-plugin (`DEVICE_LIST_STRATEGY`),
//! with the same names and meanings.
//!
//! - `envvar`: `NVIDIA_VISIBLE_DEVICES=<uuid>,...`, for the NVIDIA container
//!   runtime (what HAMi does).
//! - `cdi-cri`: the fully-qualified CDI names (`nvidia.com/gpu=<uuid>`) in
//!   the answer's `cdi_devices`, which the kubelet passes to the runtime in
//!   the CRI request (containerd ≥ 1.7, CRI-O ≥ 1.23 with CDI enabled).
//! - `cdi-annotations`: the same names as the value of one container
//!   annotation `cdi.k8s.io/<plugin>_<id>` (the CDI library's
//!   `UpdateAnnotations` format), for runtimes that read CDI requests from
//!   annotations.
//!
//! Like NVIDIA's plugin, `NVIDIA_VISIBLE_DEVICES` is set only when `envvar`
//! is among the strategies. NVIDIA's plugin writes its own CDI specs with the
//! vendor `k8s.device-plugin.nvidia.com`; Tessera writes none and names the
//! devices of the specs `nvidia-ctk cdi generate` writes (`nvidia.com/gpu`),
//! which `--cdi-kind` changes.

use std::collections::BTreeMap;

use clap::ValueEnum;
use tessera_api::env;

/// One way of passing the device list to the container runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES`, for the NVIDIA container runtime.
    Envvar,
    /// CDI device names in the Allocate answer (CRI `CDIDevices`).
    CdiCri,
    /// CDI device names in a container annotation.
    CdiAnnotations,
}

/// The CDI kind (`vendor/class`) of the devices `nvidia-ctk cdi generate` writes.
pub const DEFAULT_CDI_KIND: &str = "nvidia.com/gpu";
/// The CDI library's annotation prefix (`cdi.k8s.io/`), NVIDIA's default.
pub const DEFAULT_CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// The plugin part of the CDI annotation key (`<prefix><plugin>_<id>`).
pub const CDI_ANNOTATION_PLUGIN: &str = "tessera-node-agent";
/// The CDI library's limit on `<plugin>_<id>`.
const MAX_ANNOTATION_NAME: usize = 63;

/// How Allocate passes the devices on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceList {
    /// The strategies used (any combination).
    pub strategies: Vec<DeviceListStrategy>,
    /// The CDI kind, `vendor/class`.
    pub cdi_kind: String,
    /// The prefix of the CDI annotation's key, ending in `/`.
    pub cdi_annotation_prefix: String,
}

impl Default for DeviceList {
    fn default() -> Self {
        Self {
            strategies: vec![DeviceListStrategy::Envvar],
            cdi_kind: DEFAULT_CDI_KIND.to_owned(),
            cdi_annotation_prefix: DEFAULT_CDI_ANNOTATION_PREFIX.to_owned(),
        }
    }
}

/// What the strategies add to one container's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Container annotations.
    pub annotations: BTreeMap<String, String>,
    /// Fully-qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

impl DeviceList {
    /// Whether `strategy` is used.
    pub fn includes(&self, strategy: DeviceListStrategy) -> bool {
        self.strategies.contains(&strategy)
    }

    /// The answer's part for the GPUs `uuids`; `request` makes the CDI
    /// annotation's key unique (the pod UID).
    pub fn list(&self, uuids: &[&str], request: &str) -> Listed {
        let mut listed = Listed::default();
        if self.includes(DeviceListStrategy::Envvar) {
            listed
                .envs
                .insert(env::NVIDIA_VISIBLE_DEVICES.to_owned(), uuids.join(","));
        }
        let names: Vec<String> = uuids
            .iter()
            .map(|uuid| format!("{}={uuid}", self.cdi_kind))
            .collect();
        if self.includes(DeviceListStrategy::CdiAnnotations) {
            listed.annotations.insert(
                format!("{}{}", self.cdi_annotation_prefix, annotation_name(request)),
                names.join(","),
            );
        }
        if self.includes(DeviceListStrategy::CdiCri) {
            listed.cdi_devices = names;
        }
        listed
    }
}

/// `<plugin>_<request>` as the CDI library's `AnnotationKey` requires it:
/// at most 63 characters, letters, digits, `_`, `-` and `.`, beginning and
/// ending with a letter or digit.
fn annotation_name(request: &str) -> String {
    let request: String = request
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut name = format!("{CDI_ANNOTATION_PLUGIN}_{request}");
    name.truncate(MAX_ANNOTATION_NAME);
    while name.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        name.pop();
    }
    name
}

/// Parses `--cdi-kind`: `vendor/class` by the CDI specification's rules
/// (each begins with a letter, ends with a letter or digit, and holds only
/// letters, digits, `_`, `-` and `.`).
pub fn parse_cdi_kind(kind: &str) -> Result<String, String> {
    let valid = |part: &str| {
        part.starts_with(|c: char| c.is_ascii_alphabetic())
            && part.ends_with(|c: char| c.is_ascii_alphanumeric())
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    match kind.split_once('/') {
        Some((vendor, class)) if valid(vendor) && valid(class) => Ok(kind.to_owned()),
        _ => Err(
            "must be vendor/class (for example nvidia.com/gpu): each beginning with a letter, ending with a letter or digit, and holding only letters, digits, '_', '-' and '.'"
                .to_owned(),
        ),
    }
}

/// Parses `--cdi-annotation-prefix`: a DNS-style prefix ending in `/`, like
/// `cdi.k8s.io/` or `nvidia.cdi.k8s.io/`.
pub fn parse_cdi_annotation_prefix(prefix: &str) -> Result<String, String> {
    let Some(domain) = prefix.strip_suffix('/') else {
        return Err("must end with '/' (for example cdi.k8s.io/)".to_owned());
    };
    let valid = !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label.starts_with(|c: char| c.is_ascii_alphanumeric())
                && label.ends_with(|c: char| c.is_ascii_alphanumeric())
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if valid {
        Ok(prefix.to_owned())
    } else {
        Err("must be a DNS name followed by '/' (for example cdi.k8s.io/)".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUIDS: [&str; 2] = [
        "GPU-8a5e4d5c-0000-1111-2222-333344445555",
        "GPU-1b2c3d4e-6666-7777-8888-999900001111",
    ];
    const POD_UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    fn list(strategies: &[DeviceListStrategy]) -> DeviceList {
        DeviceList {
            strategies: strategies.to_vec(),
            ..DeviceList::default()
        }
    }

    #[test]
    fn the_annotation_key_follows_the_cdi_librarys_rules() {
        assert_eq!(
            annotation_name(POD_UID),
            format!("tessera-node-agent_{POD_UID}")
        );
        let long = annotation_name(&"a/b".repeat(40));
        // Cut at 63, then the trailing '_' goes.
        assert_eq!(long.len(), MAX_ANNOTATION_NAME - 1, "{long}");
        assert!(long.starts_with("tessera-node-agent_a_b"));
        assert!(
            long.ends_with(|c: char| c.is_ascii_alphanumeric()),
            "{long}"
        );
        assert_eq!(annotation_name("x!"), "tessera-node-agent_x");
    }

    #[test]
    fn every_strategy_adds_its_part() {
        let all = list(&[
            DeviceListStrategy::Envvar,
            DeviceListStrategy::CdiCri,
            DeviceListStrategy::CdiAnnotations,
        ])
        .list(&UUIDS, POD_UID);
        assert_eq!(all.envs["NVIDIA_VISIBLE_DEVICES"], UUIDS.join(","));
        assert_eq!(
            all.cdi_devices,
            [
                format!("nvidia.com/gpu={}", UUIDS[0]),
                format!("nvidia.com/gpu={}", UUIDS[1])
            ]
        );
        assert_eq!(all.annotations.len(), 1);
        assert_eq!(
            all.annotations[&format!("cdi.k8s.io/tessera-node-agent_{POD_UID}")],
            all.cdi_devices.join(",")
        );
    }

    #[test]
    fn cdi_kinds_and_prefixes_are_checked() {
        for good in ["nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu", "a/b"] {
            assert_eq!(parse_cdi_kind(good).as_deref(), Ok(good));
        }
        for bad in [
            "nvidia.com",
            "/gpu",
            "nvidia.com/",
            "1vendor/gpu",
            "v/g/x",
            "v/gpu-",
        ] {
            assert!(parse_cdi_kind(bad).is_err(), "{bad}");
        }
        for good in ["cdi.k8s.io/", "nvidia.cdi.k8s.io/"] {
            assert_eq!(parse_cdi_annotation_prefix(good).as_deref(), Ok(good));
        }
        for bad in [
            "cdi.k8s.io",
            "/",
            "cdi..io/",
            "-cdi.io/",
            "cdi.k8s.io//",
            "a b/",
        ] {
            assert!(parse_cdi_annotation_prefix(bad).is_err(), "{bad}");
        }
    }
}
