use std::collections::{BTreeMap, BTreeSet};

use tessera_api::v1alpha1::{AllocationPhase, DeviceHealth};

use crate::{
    backend::HostUsage,
    monitor::{
        Reading, Scrape, Usage, render,
        tests::{allocation, device},
    },
};

/// Every series of HAMi v2.9.0's vGPU monitor (`cmd/vGPUmonitor/metrics.go`)
/// with its labels, `zone` included (`WrapRegistererWith({"zone": "vGPU"})`);
/// the legacy ones are those `--legacy-metrics` adds. `hami_build_info` is
/// registered outside the zone wrapper.
const HAMI_V2_9: &[(&str, &[&str])] = &[
    (
        "hami_host_gpu_memory_used_bytes",
        &["device_index", "device_uuid", "device_type", "zone"],
    ),
    (
        "hami_host_gpu_utilization_ratio",
        &["device_index", "device_uuid", "device_type", "zone"],
    ),
    ("hami_vgpu_memory_used_bytes", CONTAINER),
    ("hami_vgpu_memory_limit_bytes", CONTAINER),
    (
        "hami_container_device_memory_bytes",
        &[
            "namespace",
            "pod",
            "container",
            "vdevice_index",
            "device_uuid",
            "context_size",
            "module_size",
            "buffer_size",
            "offset",
            "zone",
        ],
    ),
    ("hami_container_device_utilization_ratio", CONTAINER),
    ("hami_container_last_kernel_elapsed_seconds", CONTAINER),
    (
        "hami_mig_device_info",
        &[
            "namespace",
            "pod",
            "container",
            "vdevice_index",
            "device_uuid",
            "instance_id",
            "zone",
        ],
    ),
    ("hami_vgpu_memory_context_bytes", CONTAINER),
    ("hami_vgpu_memory_module_bytes", CONTAINER),
    ("hami_vgpu_memory_buffer_bytes", CONTAINER),
    (
        "hami_build_info",
        &[
            "version",
            "revision",
            "build_date",
            "go_version",
            "compiler",
            "platform",
        ],
    ),
    (
        "HostGPUMemoryUsage",
        &["deviceidx", "deviceuuid", "devicetype", "zone"],
    ),
    (
        "HostCoreUtilization",
        &["deviceidx", "deviceuuid", "devicetype", "zone"],
    ),
    ("vGPU_device_memory_usage_in_bytes", LEGACY_CONTAINER),
    ("vGPU_device_memory_limit_in_bytes", LEGACY_CONTAINER),
    (
        "Device_memory_desc_of_container",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
            "context",
            "module",
            "data",
            "offset",
            "zone",
        ],
    ),
    ("Device_utilization_desc_of_container", LEGACY_CONTAINER),
    ("Device_last_kernel_of_container", LEGACY_CONTAINER),
    (
        "MigInfo",
        &[
            "podnamespace",
            "podname",
            "ctrname",
            "vdeviceid",
            "deviceuuid",
            "instanceid",
            "zone",
        ],
    ),
];
const CONTAINER: &[&str] = &[
    "namespace",
    "pod",
    "container",
    "vdevice_index",
    "device_uuid",
    "zone",
];
const LEGACY_CONTAINER: &[&str] = &[
    "podnamespace",
    "podname",
    "ctrname",
    "vdeviceid",
    "deviceuuid",
    "zone",
];

type Series = BTreeMap<String, BTreeSet<String>>;

/// Series name → label names of every sample in a metrics text.
fn encoded(text: &str) -> Series {
    let mut series = Series::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, rest) = match line.find(['{', ' ']) {
            Some(at) => line.split_at(at),
            None => (line, ""),
        };
        let labels = series.entry(name.to_owned()).or_default();
        let Some(mut rest) = rest.strip_prefix('{') else {
            continue;
        };
        // key="value" pairs; values are quoted, with \" and \\ escaped.
        while let Some((key, after)) = rest.split_once("=\"") {
            labels.insert(key.trim_start_matches(',').to_owned());
            let mut escaped = false;
            let end = after
                .char_indices()
                .find(|&(_, c)| {
                    let closes = c == '"' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                })
                .map_or(after.len(), |(i, _)| i);
            rest = &after[(end + 1).min(after.len())..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    series
}

/// A table of docs/node-agent.md, found by the heading above it: per row,
/// the series name (first column), its label names (second) and its scheme
/// (third).
fn docs_table(heading: &str) -> Vec<(String, BTreeSet<String>, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/node-agent.md");
    let docs = std::fs::read_to_string(path).unwrap();
    let section = docs
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{heading} not in {path}"))
        .1;
    let cell = |c: &str| c.trim().trim_matches('`').to_owned();
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
            let labels = cells
                .get(1)
                .map(|c| {
                    c.split(',')
                        .map(cell)
                        .filter(|l| !l.is_empty() && l != "none")
                        .collect()
                })
                .unwrap_or_default();
            let scheme = cells.get(2).map(|c| cell(c)).unwrap_or_default();
            (cell(cells[0]), labels, scheme)
        })
        .collect()
}

/// A scrape that fills every series the agent can export.
fn everything(legacy: bool) -> String {
    let devices = [device("GPU-0", 0, DeviceHealth::Healthy)];
    let allocations = [allocation(
        "a",
        "uid-a",
        1000,
        Some(AllocationPhase::Allocated),
    )];
    let mut usage = Usage::new();
    usage.insert(
        ("uid-a_main".into(), 0),
        Reading {
            used: 300 << 20,
            launched_at: Some(1_000_000_000),
            busy_ns: 0,
        },
    );
    let core_use = [(("uid-a_main".to_owned(), 0), 25)].into_iter().collect();
    let host = [HostUsage {
        uuid: "GPU-0".into(),
        index: 0,
        model: "NVIDIA A100-SXM4-80GB".into(),
        memory_used_bytes: Some(2 << 30),
        utilization_percent: Some(42),
    }];
    render(&Scrape {
        node: "n1",
        devices: &devices,
        allocations: &allocations,
        usage: &usage,
        core_use: &core_use,
        core_policy: tessera_api::v1alpha1::CorePolicy::Force,
        refused: &Default::default(),
        host: &host,
        now_ns: 4_500_000_000,
        legacy,
    })
}

fn hami_only(series: Series) -> Series {
    series
        .into_iter()
        .filter(|(name, _)| !name.starts_with("tessera_"))
        .collect()
}

#[test]
fn the_docs_table_is_what_the_agent_exports() {
    let documented = docs_table("### HAMi-compatible series");
    assert!(!documented.is_empty());
    let table = |legacy: bool| -> Series {
        documented
            .iter()
            .filter(|(_, _, scheme)| legacy || scheme != "legacy")
            .map(|(name, labels, _)| (name.clone(), labels.clone()))
            .collect()
    };
    for (_, _, scheme) in &documented {
        assert!(
            ["v2.9", "legacy", "guide"].contains(&scheme.as_str()),
            "{scheme}"
        );
    }
    assert_eq!(hami_only(encoded(&everything(false))), table(false));
    assert_eq!(hami_only(encoded(&everything(true))), table(true));
}

#[test]
fn every_series_has_hamis_name_and_labels() {
    let hami: Series = HAMI_V2_9
        .iter()
        .map(|(name, labels)| {
            (
                (*name).to_owned(),
                labels.iter().map(|l| (*l).to_owned()).collect(),
            )
        })
        .collect();
    // The tuning guide's series are not the monitor's: they take v2.9's
    // container labels.
    let guide: Series = docs_table("### HAMi-compatible series")
        .into_iter()
        .filter(|(_, _, scheme)| scheme == "guide")
        .map(|(name, labels, _)| (name, labels))
        .collect();
    assert_eq!(
        guide.keys().collect::<Vec<_>>(),
        [
            "hami_vgpu_core_limit_percent",
            "hami_vgpu_core_used_percent"
        ]
    );
    for labels in guide.values() {
        assert_eq!(labels, &hami["hami_vgpu_memory_used_bytes"]);
    }
    for (name, labels) in hami_only(encoded(&everything(true))) {
        if guide.contains_key(&name) {
            continue;
        }
        assert_eq!(
            hami.get(&name),
            Some(&labels),
            "{name} is not HAMi v2.9's, or its labels differ"
        );
    }
    // And every HAMi series is documented with HAMi's labels: exported, or
    // said why not.
    let documented: Series = docs_table("### HAMi-compatible series")
        .into_iter()
        .chain(docs_table("### HAMi series not exported"))
        .filter(|(_, _, scheme)| scheme != "guide")
        .map(|(name, labels, _)| (name, labels))
        .collect();
    assert_eq!(documented, hami);
}

#[test]
fn values_are_hamis_and_legacy_repeats_them() {
    let text = everything(true);
    let container = r#"container="main",device_uuid="GPU-0",namespace="ml",pod="a",vdevice_index="0",zone="vGPU""#;
    let legacy = r#"ctrname="main",deviceuuid="GPU-0",podname="a",podnamespace="ml",vdeviceid="0",zone="vGPU""#;
    let host = r#"device_index="0",device_type="NVIDIA-NVIDIA A100-SXM4-80GB",device_uuid="GPU-0",zone="vGPU""#;
    let legacy_host =
        r#"deviceidx="0",devicetype="NVIDIA-NVIDIA A100-SXM4-80GB",deviceuuid="GPU-0",zone="vGPU""#;
    for line in [
        format!("hami_host_gpu_memory_used_bytes{{{host}}} {}", 2u64 << 30),
        format!("HostGPUMemoryUsage{{{legacy_host}}} {}", 2u64 << 30),
        format!("hami_host_gpu_utilization_ratio{{{host}}} 42"),
        format!("HostCoreUtilization{{{legacy_host}}} 42"),
        format!(
            "hami_vgpu_memory_used_bytes{{{container}}} {}",
            300u64 << 20
        ),
        format!(
            "vGPU_device_memory_usage_in_bytes{{{legacy}}} {}",
            300u64 << 20
        ),
        format!(
            "hami_vgpu_memory_limit_bytes{{{container}}} {}",
            1000u64 << 20
        ),
        format!(
            "vGPU_device_memory_limit_in_bytes{{{legacy}}} {}",
            1000u64 << 20
        ),
        // Launched at 1 s, scraped at 4.5 s: 3 whole seconds, as HAMi rounds.
        format!("hami_container_last_kernel_elapsed_seconds{{{container}}} 3"),
        format!("Device_last_kernel_of_container{{{legacy}}} 3"),
        format!("hami_vgpu_core_used_percent{{{container}}} 25"),
        format!("hami_vgpu_core_limit_percent{{{container}}} 30"),
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
}
