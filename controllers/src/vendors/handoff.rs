//! What another vendor's device plugin reads at Allocate, in HAMi's exact
//! encodings (`pkg/device/devices.go` `EncodePodSingleDevice`,
//! `pkg/scheduler/scheduler.go` `Bind`, `pkg/util/nodelock`, each vendor's
//! `PatchAnnotations`): the plugin finds the pod by `hami.io/vgpu-node` and
//! `hami.io/bind-phase: allocating`, reads its devices from
//! `hami.io/<x>-devices-to-allocate` (Ascend also `huawei.com/<chip>`), sets
//! `bind-phase` to `success` and deletes the Node's `hami.io/mutex.lock`.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use serde::Serialize;
use tessera_api::{
    names::{amd, cambricon, enflame, kunlun, metax, mthreads, neuron},
    v1alpha1::{DeviceFamily, DeviceSlice, VgpuAllocationSpec},
};
use tessera_scheduling::request::RequestConfig;

use tessera_api::names::handoff::{BIND_PHASE, BIND_TIME, MUTEX_LOCK, VGPU_NODE, VGPU_TIME};
/// HAMi's Ascend annotation with the time of the Filter decision.
const PREDICATE_TIME: &str = "predicate-time";

/// The annotation keys of one vendor device type: where the plugin reads
/// its devices, and the copy HAMi keeps for itself (Hygon's are spelled
/// `dcu`, Ascend's with the chip: HAMi's `InRequestDevices`).
fn keys(device_type: &str) -> (String, String) {
    let word = match device_type {
        "DCU" => "dcu",
        "MLU" => "cambricon-mlu",
        "Mthreads" => "mthreads-vgpu",
        metax::GPU_TYPE => "metax-gpu",
        enflame::GCU_TYPE => "enflame-gcu",
        metax::SGPU_TYPE => "metax-sgpu",
        AMD => amd::HANDOFF_WORD,
        kunlun::VXPU_TYPE => "xpu",
        chip => chip,
    };
    (
        format!("hami.io/{word}-devices-to-allocate"),
        format!("hami.io/{word}-devices-allocated"),
    )
}

/// What AMD slices are grouped under (HAMi's `AMDDevice`); each is written
/// with its product type (`AMD Instinct MI300X VF`), as HAMi's AMD `Fit`
/// keeps it.
const AMD: &str = "AMD";

/// The device type a family's slices are keyed by in HAMi's annotations:
/// Hygon's `DCU`; Ascend's and Iluvatar's chip (`Ascend910B4`, `MR-V100`).
fn handoff_type(slice: &DeviceSlice) -> Option<&str> {
    match slice.family {
        DeviceFamily::Nvidia => None,
        DeviceFamily::Hygon => Some("DCU"),
        DeviceFamily::Cambricon => Some("MLU"),
        DeviceFamily::Mthreads => Some("Mthreads"),
        DeviceFamily::Ascend | DeviceFamily::Iluvatar => Some(slice.model.as_str()),
        DeviceFamily::Metax if slice.model == metax::SGPU_TYPE => Some(metax::SGPU_TYPE),
        DeviceFamily::Metax => Some(metax::GPU_TYPE),
        DeviceFamily::Enflame if slice.model == enflame::DRS_TYPE => Some(enflame::DRS_TYPE),
        DeviceFamily::Enflame => Some(enflame::GCU_TYPE),
        DeviceFamily::Amd => Some(AMD),
        DeviceFamily::Kunlunxin if slice.model == kunlun::VXPU_TYPE => Some(kunlun::VXPU_TYPE),
        DeviceFamily::Kunlunxin => Some(kunlun::XPU_TYPE),
        DeviceFamily::AwsNeuron => Some(neuron::DEVICE_TYPE),
    }
}

/// One Ascend NPU as `huawei.com/<chip>` lists it (Go's omitempty kept).
#[derive(Serialize)]
struct RuntimeInfo<'a> {
    #[serde(rename = "UUID")]
    uuid: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    temp: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    memory: u64,
    #[serde(skip_serializing_if = "is_zero_u32")]
    core: u32,
}

/// One sGPU as MetaX's `metax-tech.com/gpu-devices-allocated` lists it
/// (HAMi `ContainerMetaxSDevice`, Go's omitempty kept).
#[derive(Serialize)]
struct MetaxSDevice<'a> {
    uuid: &'a str,
    #[serde(skip_serializing_if = "is_zero_u32")]
    compute: u32,
    #[serde(rename = "vRam", skip_serializing_if = "is_zero")]
    v_ram: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// The pod annotations Bind writes for the vendor slices of `spec`, or an
/// empty map when it holds only NVIDIA GPUs. `containers` are the pod's
/// container names in kubelet order (init containers first): HAMi's
/// encoding keeps one `;`-ended entry per container, empty where a
/// container has no device of that type.
pub fn pod_annotations(
    spec: &VgpuAllocationSpec,
    containers: &[String],
    config: &RequestConfig,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut types: Vec<&str> = spec
        .containers
        .iter()
        .flat_map(|c| &c.devices)
        .filter_map(handoff_type)
        .collect();
    types.sort_unstable();
    types.dedup();
    let mut out = BTreeMap::new();
    if types.is_empty() {
        return out;
    }
    let seconds = now.as_second().to_string();
    out.insert(VGPU_NODE.to_owned(), spec.node_name.clone());
    out.insert(VGPU_TIME.to_owned(), seconds.clone());
    out.insert(BIND_TIME.to_owned(), seconds.clone());
    out.insert(BIND_PHASE.to_owned(), "allocating".to_owned());
    for device_type in types {
        let slices_of = |name: &str| -> Vec<&DeviceSlice> {
            spec.containers
                .iter()
                .filter(|c| c.name == name)
                .flat_map(|c| &c.devices)
                .filter(|d| handoff_type(d) == Some(device_type))
                .collect()
        };
        let mut encoded = String::new();
        for name in containers {
            for d in slices_of(name) {
                let shown = if device_type == AMD {
                    d.model.as_str()
                } else {
                    device_type
                };
                // HAMi writes a Neuron device's cores as the mask of the
                // cores it holds (3: both of two).
                let cores = if device_type == neuron::DEVICE_TYPE {
                    neuron_mask(d)
                } else {
                    d.cores
                };
                encoded.push_str(&format!("{},{shown},{},{cores}:", d.uuid, d.memory_mib));
            }
            encoded.push(';');
        }
        let (to_allocate, allocated) = keys(device_type);
        if device_type == enflame::DRS_TYPE {
            // Enflame's DRS plugin reads HAMi's list and, from Bind, the
            // partitions per container (`enflame_drs`).
            out.insert(enflame::DRS_ALLOCATED.to_owned(), encoded);
            out.insert(enflame::ASSIGNED.to_owned(), "false".to_owned());
            out.insert(
                enflame::ASSIGNED_TIME.to_owned(),
                now.as_nanosecond().to_string(),
            );
            continue;
        }
        if device_type == neuron::DEVICE_TYPE {
            // AWS's plugin reads HAMi's list, the ids (written by Bind, which
            // knows each device's cores: `neuron_ids`) and these.
            out.insert(neuron::ALLOCATED.to_owned(), encoded);
            out.insert(
                neuron::PREDICATE_TIME.to_owned(),
                now.as_nanosecond().to_string(),
            );
            out.insert(neuron::ALLOCATED_FLAG.to_owned(), "false".to_owned());
            out.insert(neuron::PREDICATE_NODE.to_owned(), spec.node_name.clone());
            continue;
        }
        if device_type == "Mthreads" || device_type == kunlun::XPU_TYPE {
            // Moore Threads' and Kunlunxin's whole-XPU plugins read the card
            // indexes of the last container with devices, and HAMi writes no
            // to-allocate list for them.
            let last = containers.iter().rev().find_map(|name| {
                let slices = slices_of(name);
                (!slices.is_empty()).then(|| {
                    slices
                        .iter()
                        .map(|d| d.index.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                })
            });
            if device_type == kunlun::XPU_TYPE {
                if let Some(indexes) = last {
                    out.insert(kunlun::DEVICE_IDX.to_owned(), indexes);
                }
                out.insert(kunlun::ALLOCATED.to_owned(), encoded);
                continue;
            }
            if let Some(indexes) = last {
                out.insert(mthreads::GPU_INDEX.to_owned(), indexes);
                out.insert(
                    mthreads::PREDICATE_TIME.to_owned(),
                    now.as_nanosecond().to_string(),
                );
                out.insert(mthreads::PREDICATE_NODE.to_owned(), spec.node_name.clone());
            }
            out.insert(allocated, encoded);
            continue;
        }
        out.insert(to_allocate, encoded.clone());
        out.insert(allocated, encoded);
        if device_type == metax::SGPU_TYPE {
            // MetaX's sGPU plugin reads every container's sGPUs as JSON.
            let per_container: Vec<Vec<MetaxSDevice<'_>>> = containers
                .iter()
                .map(|name| {
                    slices_of(name)
                        .into_iter()
                        .map(|d| MetaxSDevice {
                            uuid: &d.uuid,
                            compute: d.cores,
                            v_ram: d.memory_mib,
                        })
                        .collect()
                })
                .collect();
            out.insert(
                metax::ALLOCATED.to_owned(),
                serde_json::to_string(&per_container).unwrap_or_else(|_| "[]".into()),
            );
            out.insert(
                metax::PREDICATE_TIME.to_owned(),
                now.as_nanosecond().to_string(),
            );
        }
        if device_type == "MLU" {
            // Cambricon's dynamic-smlu plugin reads the first MLU's profile.
            if let Some(d) = containers
                .iter()
                .find_map(|name| slices_of(name).first().copied())
            {
                out.insert(
                    cambricon::DSMLU_PROFILE.to_owned(),
                    format!(
                        "{}_{}_{}",
                        d.index,
                        d.cores,
                        d.memory_mib / cambricon::MEMORY_UNIT_MIB
                    ),
                );
            }
            // HAMi's spelling, and the one Cambricon's plugin reads.
            for key in [
                cambricon::DSMLU_ASSIGNED,
                cambricon::DSMLU_ASSIGNED_BY_PLUGIN,
            ] {
                out.insert(key.to_owned(), "false".to_owned());
            }
        }
        let chip = config
            .vnpus
            .iter()
            .flat_map(|v| &v.configs)
            .find(|c| c.common_word == device_type);
        if let Some(chip) = chip {
            let infos: Vec<RuntimeInfo<'_>> = containers
                .iter()
                .flat_map(|name| slices_of(name))
                .map(|d| RuntimeInfo {
                    uuid: &d.uuid,
                    temp: d.template.as_deref().unwrap_or_default(),
                    memory: d.memory_mib,
                    core: d.cores,
                })
                .collect();
            out.insert(
                format!("huawei.com/{}", chip.common_word),
                serde_json::to_string(&infos).unwrap_or_else(|_| "[]".into()),
            );
            out.insert(PREDICATE_TIME.to_owned(), seconds.clone());
        }
    }
    out
}

/// A Neuron slice's cores as HAMi encodes them: the mask of the cores it
/// holds (a slice by count holds every core of its device).
fn neuron_mask(slice: &DeviceSlice) -> u32 {
    if slice.core_indexes.is_empty() {
        1u32.checked_shl(slice.cores).map_or(u32::MAX, |m| m - 1)
    } else {
        slice
            .core_indexes
            .iter()
            .filter(|&&i| i < 32)
            .fold(0, |mask, &i| mask | (1 << i))
    }
}

/// AWS's `AWS_NEURON_IDS` (and `NEURON_RESOURCE_TYPE`) for the Neuron
/// slices of `spec`, in container order: a device's index for a container
/// that asked for devices, else the node's numbers of its cores (device
/// index × `cores_per_device(uuid)` + core, HAMi's `PatchAnnotations`).
/// Empty without Neuron slices.
pub fn neuron_ids(
    spec: &VgpuAllocationSpec,
    containers: &[String],
    cores_per_device: impl Fn(&str) -> u32,
    config: &RequestConfig,
) -> BTreeMap<String, String> {
    let mut ids = Vec::new();
    let mut by_core = false;
    for name in containers {
        let slices = spec
            .containers
            .iter()
            .filter(|c| &c.name == name)
            .flat_map(|c| &c.devices)
            .filter(|d| d.family == DeviceFamily::AwsNeuron);
        for d in slices {
            if d.core_indexes.is_empty() {
                ids.push(d.index);
            } else {
                by_core = true;
                let first = d.index.saturating_mul(cores_per_device(&d.uuid));
                ids.extend(d.core_indexes.iter().map(|c| first.saturating_add(*c)));
            }
        }
    }
    let mut out = BTreeMap::new();
    if ids.is_empty() {
        return out;
    }
    let listed: Vec<String> = ids.iter().map(u32::to_string).collect();
    out.insert(neuron::ASSIGNED_INDEX.to_owned(), listed.join(","));
    if let Some(neuron) = config.awsneuron.as_ref().filter(|_| by_core) {
        out.insert(
            neuron::RESOURCE_TYPE.to_owned(),
            neuron.resource_core_name.clone(),
        );
    }
    out
}

/// One container's DRS partition as Enflame's plugin reads it from
/// `assigned-containers` (HAMi `assignedContainerInfo`, Go's omitempty
/// kept).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AssignedContainer<'a> {
    allocated: bool,
    request: u32,
    #[serde(rename = "profileID", skip_serializing_if = "str::is_empty")]
    profile_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    profile_name: &'a str,
}

/// Enflame DRS (HAMi's enflame `PatchAnnotations`): `assigned-containers`,
/// per container with a DRS GCU its partition (`request`: the profile's
/// slices, and the profile's id and name), and for the first such
/// container its GCU's index (`gcu-assigned-index`, `-id`), minor and
/// slices. `profile(uuid, name)` gives a device's minor and the plugin's
/// id of a profile, from the GpuNode. Empty without DRS slices.
pub fn enflame_drs(
    spec: &VgpuAllocationSpec,
    containers: &[String],
    profile: impl Fn(&str, &str) -> (Option<String>, String),
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut assigned: Vec<(&str, u32, &str, String)> = Vec::new();
    for name in containers {
        let Some(d) = spec
            .containers
            .iter()
            .filter(|c| &c.name == name)
            .flat_map(|c| &c.devices)
            .find(|d| d.family == DeviceFamily::Enflame && d.model == enflame::DRS_TYPE)
        else {
            continue;
        };
        let profile_name = d.template.as_deref().unwrap_or_default();
        let size = tessera_scheduling::request::drs_profile(profile_name).map_or(1, |(s, _)| s);
        let (minor, id) = profile(&d.uuid, profile_name);
        if !out.contains_key(enflame::ASSIGNED_INDEX) {
            out.insert(enflame::ASSIGNED_INDEX.to_owned(), d.index.to_string());
            out.insert(enflame::ASSIGNED_ID.to_owned(), d.index.to_string());
            if let Some(minor) = minor {
                out.insert(enflame::ASSIGNED_MINOR.to_owned(), minor);
            }
            out.insert(enflame::REQUEST_SIZE.to_owned(), size.to_string());
        }
        assigned.push((name, size, profile_name, id));
    }
    if assigned.is_empty() {
        return out;
    }
    let entries: BTreeMap<&str, AssignedContainer<'_>> = assigned
        .iter()
        .map(|(name, size, profile_name, id)| {
            (
                *name,
                AssignedContainer {
                    allocated: false,
                    request: *size,
                    profile_id: id,
                    profile_name,
                },
            )
        })
        .collect();
    out.insert(
        enflame::ASSIGNED_CONTAINERS.to_owned(),
        serde_json::to_string(&entries).unwrap_or_else(|_| "{}".into()),
    );
    out
}

/// The Node annotations Bind writes for the vendor slices of `spec` (none
/// for NVIDIA only): `hami.io/mutex.lock` for the plugins that find the pod
/// through it (Hygon, Ascend, Iluvatar, MetaX sGPU, AMD, Kunlunxin vXPU),
/// Cambricon's
/// `cambricon.com/dsmlu.lock`.
pub fn node_annotations(
    spec: &VgpuAllocationSpec,
    namespace: &str,
    pod: &str,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let slices = || spec.containers.iter().flat_map(|c| &c.devices);
    let mut out = BTreeMap::new();
    if slices().any(takes_mutex_lock) {
        out.insert(MUTEX_LOCK.to_owned(), mutex_value(namespace, pod, now));
    }
    if slices().any(|d| d.family == DeviceFamily::Cambricon) {
        let time = now
            .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        out.insert(cambricon::DSMLU_LOCK.to_owned(), time);
    }
    out
}

/// Whether the plugin serving `slice` finds its pod through
/// `hami.io/mutex.lock`.
fn takes_mutex_lock(slice: &DeviceSlice) -> bool {
    matches!(
        slice.family,
        DeviceFamily::Hygon | DeviceFamily::Ascend | DeviceFamily::Iluvatar | DeviceFamily::Amd
    ) || matches!(
        handoff_type(slice),
        Some(metax::SGPU_TYPE | kunlun::VXPU_TYPE)
    )
}

/// The container names of a pod in kubelet order: init containers, then
/// app containers.
pub fn container_order(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c| c.name.clone())
        .collect()
}

/// The Node lock value for a pod, as HAMi's `GenerateNodeLockKeyByPod`.
pub fn mutex_value(namespace: &str, pod: &str, now: Timestamp) -> String {
    let time = now
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .strftime("%Y-%m-%dT%H:%M:%SZ");
    format!("{time},{namespace},{pod}")
}

/// Whether a Node lock value names this pod (HAMi's owner check: the
/// value ends with `,<namespace>,<pod>`).
pub fn mutex_held_by(value: &str, namespace: &str, pod: &str) -> bool {
    value.ends_with(&format!(",{namespace},{pod}"))
}

#[cfg(test)]
mod tests {
    use tessera_api::{
        testing::{allocation, container},
        v1alpha1::DeviceSlice,
    };
    use tessera_scheduling::request::{VnpuConfig, VnpusConfig};

    use super::*;

    fn slice(
        uuid: &str,
        family: DeviceFamily,
        model: &str,
        mib: u64,
        cores: u32,
        template: Option<&str>,
    ) -> DeviceSlice {
        DeviceSlice {
            uuid: uuid.into(),
            family,
            model: model.into(),
            memory_mib: mib,
            cores,
            template: template.map(Into::into),
            ..DeviceSlice::default()
        }
    }

    #[test]
    fn hygon_devices_are_encoded_per_container_with_empty_entries_kept() {
        let spec = allocation("p", "u", "n1")
            .container(container(
                "main",
                vec![
                    slice("DCU-0", DeviceFamily::Hygon, "DCU-Z100", 4096, 30, None),
                    slice("DCU-1", DeviceFamily::Hygon, "DCU-Z100", 4096, 30, None),
                ],
            ))
            .build()
            .spec;
        let order = vec!["init".to_owned(), "main".to_owned(), "sidecar".to_owned()];
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(&spec, &order, &RequestConfig::default(), now);
        assert_eq!(
            out["hami.io/dcu-devices-to-allocate"],
            ";DCU-0,DCU,4096,30:DCU-1,DCU,4096,30:;;"
        );
        assert_eq!(
            out["hami.io/dcu-devices-allocated"],
            out["hami.io/dcu-devices-to-allocate"]
        );
        assert_eq!(out[VGPU_NODE], "n1");
        assert_eq!(out[BIND_PHASE], "allocating");
        assert_eq!(out[BIND_TIME], "1795773600");
        assert!(!out.contains_key("huawei.com/DCU"));
    }

    #[test]
    fn ascend_gets_hamis_runtime_info_with_the_template() {
        let config = RequestConfig {
            vnpus: Some(VnpusConfig {
                hami_vnpu_core: false,
                configs: vec![VnpuConfig {
                    common_word: "Ascend910B4".into(),
                    ..VnpuConfig::default()
                }],
            }),
            ..RequestConfig::default()
        };
        let spec = allocation("p", "u", "n1")
            .container(container(
                "main",
                vec![slice(
                    "NPU-3",
                    DeviceFamily::Ascend,
                    "Ascend910B4",
                    8192,
                    0,
                    Some("vir05_1c_8g"),
                )],
            ))
            .build()
            .spec;
        let out = pod_annotations(&spec, &["main".to_owned()], &config, Timestamp::now());
        assert_eq!(
            out["hami.io/Ascend910B4-devices-to-allocate"],
            "NPU-3,Ascend910B4,8192,0:;"
        );
        assert_eq!(
            out["huawei.com/Ascend910B4"],
            r#"[{"UUID":"NPU-3","temp":"vir05_1c_8g","memory":8192}]"#
        );
        assert!(out.contains_key("predicate-time"));
    }

    #[test]
    fn iluvatar_devices_are_keyed_by_their_chip() {
        let spec = allocation("p", "u", "n1")
            .container(container(
                "main",
                vec![slice(
                    "ilu-0",
                    DeviceFamily::Iluvatar,
                    "MR-V100",
                    4096,
                    50,
                    None,
                )],
            ))
            .build()
            .spec;
        let out = pod_annotations(
            &spec,
            &["main".to_owned()],
            &RequestConfig::default(),
            Timestamp::now(),
        );
        assert_eq!(
            out["hami.io/MR-V100-devices-to-allocate"],
            "ilu-0,MR-V100,4096,50:;"
        );
        assert!(!out.contains_key("huawei.com/MR-V100"));
    }

    #[test]
    fn cambricon_gets_its_profile_and_its_own_node_lock() {
        let mut mlu = slice(
            "node-cambricon-mlu-1",
            DeviceFamily::Cambricon,
            "MLU",
            4096,
            50,
            None,
        );
        mlu.index = 1;
        let spec = allocation("p", "u", "n1")
            .container(container("main", vec![mlu]))
            .build()
            .spec;
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(
            &spec,
            &["init".to_owned(), "main".to_owned()],
            &RequestConfig::default(),
            now,
        );
        assert_eq!(
            out["hami.io/cambricon-mlu-devices-to-allocate"],
            ";node-cambricon-mlu-1,MLU,4096,50:;"
        );
        assert_eq!(out["CAMBRICON_DSMLU_PROFILE"], "1_50_16");
        assert_eq!(out["CAMBRICON_DSMLU_ASSIGNED"], "false");
        // Cambricon's plugin finds the pod by its own spelling.
        assert_eq!(out["CAMBRICON_DSMLU_ASSIGHED"], "false");
        let node = node_annotations(&spec, "ml", "p", now);
        assert_eq!(
            node,
            BTreeMap::from([(
                "cambricon.com/dsmlu.lock".to_owned(),
                "2026-11-27T10:00:00Z".to_owned()
            )])
        );
        let dcu = allocation("p", "u", "n1")
            .container(container(
                "main",
                vec![slice("DCU-0", DeviceFamily::Hygon, "DCU", 1, 1, None)],
            ))
            .build()
            .spec;
        assert_eq!(
            node_annotations(&dcu, "ml", "p", now)
                .keys()
                .collect::<Vec<_>>(),
            ["hami.io/mutex.lock"]
        );
    }

    #[test]
    fn moore_threads_gets_card_indexes_and_no_lock() {
        let mut gpu = slice(
            "n1-mthreads-1",
            DeviceFamily::Mthreads,
            "Mthreads",
            8192,
            4,
            None,
        );
        gpu.index = 1;
        let spec = allocation("p", "u", "n1")
            .container(container("main", vec![gpu]))
            .build()
            .spec;
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(&spec, &["main".to_owned()], &RequestConfig::default(), now);
        assert_eq!(
            out["hami.io/mthreads-vgpu-devices-allocated"],
            "n1-mthreads-1,Mthreads,8192,4:;"
        );
        assert!(!out.contains_key("hami.io/mthreads-vgpu-devices-to-allocate"));
        assert_eq!(out["mthreads.com/gpu-index"], "1");
        assert_eq!(out["mthreads.com/predicate-node"], "n1");
        assert_eq!(out["mthreads.com/predicate-time"], "1795773600000000000");
        assert!(
            node_annotations(&spec, "ml", "p", now).is_empty(),
            "HAMi takes no lock for Moore Threads"
        );
    }

    #[test]
    fn metax_sgpus_get_hamis_lists_metax_json_and_the_mutex_lock() {
        let sgpu = |uuid: &str, mib, cores| {
            slice(uuid, DeviceFamily::Metax, "Metax-SGPU", mib, cores, None)
        };
        let spec = allocation("p", "u", "n1")
            .container(container("a", vec![sgpu("GPU-1", 4096, 60)]))
            .container(container(
                "b",
                vec![sgpu("GPU-2", 65536, 100), sgpu("GPU-3", 65536, 100)],
            ))
            .build()
            .spec;
        let order = ["a".to_owned(), "side".to_owned(), "b".to_owned()];
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(&spec, &order, &RequestConfig::default(), now);
        let encoded =
            "GPU-1,Metax-SGPU,4096,60:;;GPU-2,Metax-SGPU,65536,100:GPU-3,Metax-SGPU,65536,100:;";
        assert_eq!(out["hami.io/metax-sgpu-devices-to-allocate"], encoded);
        assert_eq!(out["hami.io/metax-sgpu-devices-allocated"], encoded);
        // HAMi's PodMetaxSDevice: one list per container, Go's field names.
        assert_eq!(
            out["metax-tech.com/gpu-devices-allocated"],
            r#"[[{"uuid":"GPU-1","compute":60,"vRam":4096}],[],[{"uuid":"GPU-2","compute":100,"vRam":65536},{"uuid":"GPU-3","compute":100,"vRam":65536}]]"#
        );
        assert_eq!(out["metax-tech.com/predicate-time"], "1795773600000000000");
        assert_eq!(
            node_annotations(&spec, "ml", "p", now)[MUTEX_LOCK],
            "2026-11-27T10:00:00Z,ml,p"
        );
        // Whole GPUs: HAMi's two lists, no MetaX JSON, no lock.
        let spec = allocation("p", "u", "n1")
            .container(container(
                "a",
                vec![slice(
                    "n1-metax-0",
                    DeviceFamily::Metax,
                    "Metax-GPU",
                    65536,
                    100,
                    None,
                )],
            ))
            .build()
            .spec;
        let out = pod_annotations(&spec, &["a".to_owned()], &RequestConfig::default(), now);
        assert_eq!(
            out["hami.io/metax-gpu-devices-to-allocate"],
            "n1-metax-0,Metax-GPU,65536,100:;"
        );
        assert_eq!(
            out["hami.io/metax-gpu-devices-allocated"],
            out["hami.io/metax-gpu-devices-to-allocate"]
        );
        assert!(!out.contains_key("metax-tech.com/gpu-devices-allocated"));
        assert!(node_annotations(&spec, "ml", "p", now).is_empty());
    }

    #[test]
    fn enflame_gcus_get_hamis_two_lists_and_no_lock() {
        // HAMi's TestGCUDevices_PatchAnnotations.
        let spec = allocation("p", "u", "n1")
            .container(container(
                "a",
                vec![slice(
                    "n1-GCU-0",
                    DeviceFamily::Enflame,
                    "GCU",
                    100,
                    100,
                    None,
                )],
            ))
            .build()
            .spec;
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(&spec, &["a".to_owned()], &RequestConfig::default(), now);
        assert_eq!(
            out["hami.io/enflame-gcu-devices-to-allocate"],
            "n1-GCU-0,GCU,100,100:;"
        );
        assert_eq!(
            out["hami.io/enflame-gcu-devices-allocated"],
            out["hami.io/enflame-gcu-devices-to-allocate"]
        );
        assert!(node_annotations(&spec, "ml", "p", now).is_empty());
    }

    #[test]
    fn amd_gpus_are_written_with_their_product_type_and_take_the_lock() {
        // HAMi's amd Test_PatchAnnotations and Fit: `uuid,type,MiB,CUs:`,
        // the type the registered product name.
        let spec = allocation("p", "u", "n1")
            .container(container(
                "a",
                vec![
                    slice(
                        "GPU-0",
                        DeviceFamily::Amd,
                        "AMD Instinct MI300X VF",
                        16384,
                        76,
                        None,
                    ),
                    slice(
                        "GPU-1",
                        DeviceFamily::Amd,
                        "AMD Instinct MI300X VF",
                        16384,
                        76,
                        None,
                    ),
                ],
            ))
            .build()
            .spec;
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(&spec, &["a".to_owned()], &RequestConfig::default(), now);
        let want = "GPU-0,AMD Instinct MI300X VF,16384,76:GPU-1,AMD Instinct MI300X VF,16384,76:;";
        assert_eq!(out["hami.io/amd-devices-to-allocate"], want);
        assert_eq!(out["hami.io/amd-devices-allocated"], want);
        assert_eq!(out[BIND_PHASE], "allocating");
        assert_eq!(
            node_annotations(&spec, "ml", "p", now)[MUTEX_LOCK],
            "2026-11-27T10:00:00Z,ml,p"
        );
    }

    #[test]
    fn kunlunxin_whole_xpus_get_their_indexes_and_vxpus_the_lock() {
        // HAMi's kunlun PatchAnnotations: whole XPUs in
        // `hami.io/kunlun-allocated` and `BAIDU_COM_DEVICE_IDX`, no lock.
        let xpu = |uuid: &str, index: u32| DeviceSlice {
            index,
            ..slice(uuid, DeviceFamily::Kunlunxin, "kunlun", 98304, 100, None)
        };
        let spec = allocation("p", "u", "n1")
            .container(container(
                "a",
                vec![xpu("n1-kunlun-4", 4), xpu("n1-kunlun-6", 6)],
            ))
            .build()
            .spec;
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(&spec, &["a".to_owned()], &RequestConfig::default(), now);
        assert_eq!(
            out["hami.io/kunlun-allocated"],
            "n1-kunlun-4,kunlun,98304,100:n1-kunlun-6,kunlun,98304,100:;"
        );
        assert_eq!(out["BAIDU_COM_DEVICE_IDX"], "4,6");
        assert!(!out.contains_key("hami.io/kunlun-devices-to-allocate"));
        assert!(node_annotations(&spec, "ml", "p", now).is_empty());
        // vXPUs: HAMi's vdevice PatchAnnotations, under hami.io/mutex.lock.
        let spec = allocation("p", "u", "n1")
            .container(container(
                "a",
                vec![slice(
                    "xpu-0",
                    DeviceFamily::Kunlunxin,
                    "XPU",
                    24576,
                    25,
                    None,
                )],
            ))
            .build()
            .spec;
        let out = pod_annotations(&spec, &["a".to_owned()], &RequestConfig::default(), now);
        assert_eq!(
            out["hami.io/xpu-devices-to-allocate"],
            "xpu-0,XPU,24576,25:;"
        );
        assert_eq!(out["hami.io/xpu-devices-allocated"], "xpu-0,XPU,24576,25:;");
        assert!(node_annotations(&spec, "ml", "p", now).contains_key(MUTEX_LOCK));
    }

    #[test]
    fn aws_neuron_devices_and_cores_are_handed_off_as_hami_does() {
        // HAMi's awsneuron TestPatchAnnotations: by count, device indexes;
        // by cores, the node's core numbers and the core resource.
        let neuron = |uuid: &str, index: u32, cores: u32, held: &[u32]| DeviceSlice {
            index,
            core_indexes: held.to_vec(),
            ..slice(uuid, DeviceFamily::AwsNeuron, "inf2.xlarge", 0, cores, None)
        };
        let config = RequestConfig {
            awsneuron: Some(tessera_scheduling::request::AwsNeuronConfig::default()),
            ..RequestConfig::default()
        };
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let by_count = allocation("p", "u", "n1")
            .container(container(
                "a",
                vec![neuron("test1", 0, 2, &[]), neuron("test2", 1, 2, &[])],
            ))
            .build()
            .spec;
        let out = pod_annotations(&by_count, &["a".to_owned()], &config, now);
        assert_eq!(
            out["hami.io/aws-neuron-devices-allocated"],
            "test1,AWSNeuron,0,3:test2,AWSNeuron,0,3:;"
        );
        assert_eq!(out["NEURON_ALLOCATED"], "false");
        assert_eq!(out["aws.amazon.com/predicate-node"], "n1");
        let ids = neuron_ids(&by_count, &["a".to_owned()], |_| 2, &config);
        assert_eq!(ids["AWS_NEURON_IDS"], "0,1");
        assert!(!ids.contains_key("NEURON_RESOURCE_TYPE"));
        let by_core = allocation("p", "u", "n1")
            .container(container("a", vec![neuron("test2", 1, 1, &[1])]))
            .build()
            .spec;
        let out = pod_annotations(&by_core, &["a".to_owned()], &config, now);
        assert_eq!(
            out["hami.io/aws-neuron-devices-allocated"],
            "test2,AWSNeuron,0,2:;"
        );
        let ids = neuron_ids(&by_core, &["a".to_owned()], |_| 2, &config);
        assert_eq!(ids["AWS_NEURON_IDS"], "3", "device 1, its second core");
        assert_eq!(ids["NEURON_RESOURCE_TYPE"], "aws.amazon.com/neuroncore");
        assert!(
            node_annotations(&by_core, "ml", "p", now).is_empty(),
            "no lock, as HAMi"
        );
    }

    #[test]
    fn enflame_drs_partitions_are_handed_off_as_hami_does() {
        // HAMi's enflame PatchAnnotations: the list, assigned=false, the
        // first container's GCU index, minor and slices, and per container
        // its partition.
        let drs = |uuid: &str, index: u32| DeviceSlice {
            index,
            ..slice(
                uuid,
                DeviceFamily::Enflame,
                "Enflame",
                20480,
                50,
                Some("3g.20gb"),
            )
        };
        let spec = allocation("p", "u", "n1")
            .container(container("a", vec![drs("n1-enflame-drs-1", 1)]))
            .container(container("b", vec![drs("n1-enflame-drs-0", 0)]))
            .build()
            .spec;
        let order = ["a".to_owned(), "b".to_owned()];
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = pod_annotations(&spec, &order, &RequestConfig::default(), now);
        assert_eq!(
            out["hami.io/enflame-vgpu-devices-allocated"],
            "n1-enflame-drs-1,Enflame,20480,50:;n1-enflame-drs-0,Enflame,20480,50:;"
        );
        assert_eq!(out["enflame.com/gcu-assigned"], "false");
        assert!(
            node_annotations(&spec, "ml", "p", now).is_empty(),
            "no lock, as HAMi"
        );
        let extra = enflame_drs(&spec, &order, |uuid, name| {
            assert_eq!(name, "3g.20gb");
            (Some(format!("minor-of-{uuid}")), "1".to_owned())
        });
        assert_eq!(extra["enflame.com/gcu-assigned-index"], "1");
        assert_eq!(extra["enflame.com/gcu-assigned-id"], "1");
        assert_eq!(
            extra["enflame.com/gcu-assigned-minor"],
            "minor-of-n1-enflame-drs-1"
        );
        assert_eq!(extra["enflame.com/gcu-request-size"], "3");
        assert_eq!(
            extra["assigned-containers"],
            r#"{"a":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"},"b":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"}}"#
        );
    }

    #[test]
    fn an_nvidia_only_allocation_writes_nothing() {
        let spec = allocation("p", "u", "n1")
            .container(container(
                "main",
                vec![tessera_api::testing::slice("GPU-0", 0, 1000, 10)],
            ))
            .build()
            .spec;
        assert!(
            pod_annotations(
                &spec,
                &["main".to_owned()],
                &RequestConfig::default(),
                Timestamp::now()
            )
            .is_empty()
        );
    }

    #[test]
    fn the_node_lock_is_hamis_time_namespace_pod() {
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let value = mutex_value("ml", "train", now);
        assert_eq!(value, "2026-11-27T10:00:00Z,ml,train");
        assert!(mutex_held_by(&value, "ml", "train"));
        assert!(!mutex_held_by(&value, "ml", "rain"));
    }
}
