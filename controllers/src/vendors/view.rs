//! From what vendor device plugins report on a Node to the GpuNode status
//! Tessera schedules from: pure, so every rule is tested without a cluster.
//!
//! Each configured source (Hygon's `hami.io/node-dcu-register`, one
//! `hami.io/node-register-<chip>` per Ascend chip) is decoded on its own; a
//! malformed one is reported and ignored, never guessed at. HAMi's register
//! handshake decides whether a source is still alive (`CheckHealth`): the
//! scheduler writes `Requesting_<time>` to the source's handshake
//! annotation, the plugin answers `Reported_<time>` on its next register
//! pass; a `Requesting` older than 60 s, with the node no longer
//! advertising the source's count resource, means the plugin is gone and
//! its devices are dropped.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{Condition, Time},
    },
    jiff::{SignedDuration, Timestamp, civil::DateTime, tz::TimeZone},
};
use tessera_api::{
    names::{ascend::NODE_SOFT_SPLIT, enflame, metax, neuron},
    v1alpha1::{
        DeviceCapacity, DeviceHealth, DeviceProfile, GpuDevice, GpuNodeStatus, OperatingMode,
        PlacementScore,
    },
};
use tessera_scheduling::request::{RequestConfig, Source, SourceKind};

use super::register::{
    DrsNode, Registered, decode_count_map, decode_csv, decode_enflame_drs, decode_json,
    decode_metax,
};

/// How long a `Requesting` handshake may stay unanswered (HAMi: 60 s).
pub const HANDSHAKE_TIMEOUT: SignedDuration = SignedDuration::from_secs(60);
/// HAMi's handshake time format (Go's `time.DateTime`), read and written in UTC.
const HANDSHAKE_FORMAT: &str = "%Y-%m-%d %H:%M:%S";

/// Every source the configuration turns on, family by family
/// ([`Family::sources`](tessera_scheduling::request::Family::sources)).
pub fn sources(config: &RequestConfig) -> Vec<Source> {
    config.families().iter().flat_map(|f| f.sources()).collect()
}

/// What a Node's vendor annotations say, and what to do about them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VendorView {
    /// The devices of every live, well-formed source.
    pub devices: Vec<GpuDevice>,
    /// Sources whose annotation is malformed: (annotation, what is wrong).
    pub malformed: Vec<(String, String)>,
    /// Sources whose plugin stopped answering the handshake: annotation names.
    pub expired: Vec<String>,
    /// Sources without a handshake whose plugin is gone (the Node no longer
    /// advertises the count resource, HAMi's `CheckHealth`): (register
    /// annotation, count resource).
    pub unadvertised: Vec<(String, String)>,
    /// Handshake annotations to write now: (key, value).
    pub handshakes: Vec<(String, String)>,
    /// The plugin's topology losses and scores by device count (MetaX
    /// whole GPUs).
    pub placement_scores: Vec<PlacementScore>,
    /// Devices dropped because their id is one the node's agent publishes
    /// (an NVIDIA GPU's UUID on a mixed node): (register annotation, id).
    /// Applied, such a device would take over the agent's entry, which the
    /// GpuNode's device list merges by uuid.
    pub collisions: Vec<(String, String)>,
}

/// The Node's vendor view; `None` when it carries no configured source's
/// register annotation (not a vendor node). No device whose id is in
/// `reserved` (the ids the node's agent publishes, on a mixed node) is
/// kept: each is recorded in [`VendorView::collisions`].
pub fn view(
    annotations: &BTreeMap<String, String>,
    allocatable: &BTreeMap<String, Quantity>,
    sources: &[Source],
    soft_split_default: bool,
    reserved: &BTreeSet<String>,
    now: Timestamp,
) -> Option<VendorView> {
    let mut view = VendorView::default();
    let mut any = false;
    let soft_split = match annotations.get(NODE_SOFT_SPLIT) {
        Some(value) => value == "true",
        None => soft_split_default,
    };
    for source in sources {
        if let SourceKind::Allocatable {
            cores,
            memory,
            unit_mib,
            per_card,
            infix,
        } = &source.kind
        {
            let cards = whole(allocatable, cores).div_ceil(u64::from(*per_card));
            let total = whole(allocatable, memory).saturating_mul(*unit_mib);
            if let Some(memory_mib) = total.checked_div(cards) {
                any = true;
                // Cambricon's and Moore Threads' cards share the memory
                // equally, 100 shares each (HAMi's `GetNodeDevices`).
                let card = Card {
                    memory_mib,
                    cores: *per_card,
                    split_count: 100,
                };
                let node = node_name(annotations);
                let cards = cards_of(&format!("{node}-{infix}"), cards, &card, source);
                extend(&mut view, cards, source, reserved);
            }
            continue;
        }
        if let SourceKind::Neuron { cores } = &source.kind {
            let devices = whole(allocatable, &source.count_resource);
            if let Some(per_device) = whole(allocatable, cores).checked_div(devices) {
                any = true;
                let per_device = u32::try_from(per_device.min(MAX_CORES_PER_DEVICE)).unwrap_or(0);
                let card = Card {
                    memory_mib: 0,
                    cores: per_device,
                    split_count: per_device,
                };
                let node = node_name(annotations);
                let model = annotations
                    .get(INSTANCE_TYPE)
                    .filter(|t| !t.is_empty() && t.len() <= 64)
                    .cloned()
                    .unwrap_or_else(|| neuron::DEVICE_TYPE.to_owned());
                let devices = cards_of(&format!("{node}-AWSNeuron"), devices, &card, source)
                    .into_iter()
                    .map(|d| GpuDevice {
                        model: model.clone(),
                        ..d
                    });
                extend(&mut view, devices, source, reserved);
            }
            continue;
        }
        if let SourceKind::Cards { memory_mib, infix } = &source.kind {
            let cards = whole(allocatable, &source.count_resource);
            if cards > 0 {
                any = true;
                // One container per card (MetaX GPUs, Enflame GCUs).
                let card = Card {
                    memory_mib: *memory_mib,
                    cores: 100,
                    split_count: 1,
                };
                let node = node_name(annotations);
                let cards = cards_of(&format!("{node}-{infix}"), cards, &card, source);
                extend(&mut view, cards, source, reserved);
                if source.topology_maps {
                    placement_scores(&mut view, annotations);
                }
            }
            continue;
        }
        let Some((register, value)) = source
            .register
            .as_ref()
            .and_then(|r| annotations.get(r).map(|v| (r, v)))
        else {
            continue;
        };
        any = true;
        if source.kind == SourceKind::EnflameDrs {
            match decode_enflame_drs(value) {
                Ok(drs) => {
                    let node = node_name(annotations).to_owned();
                    let gcus = drs_gcus(&node, &drs, source);
                    extend(&mut view, gcus, source, reserved);
                }
                Err(error) => view.malformed.push((register.clone(), error)),
            }
            continue;
        }
        if source.kind == SourceKind::MetaxJson {
            match decode_metax(value, metax::SGPU_TYPE) {
                Ok(devices) => add(&mut view, devices, source, soft_split, reserved),
                Err(error) => view.malformed.push((register.clone(), error)),
            }
            continue;
        }
        match &source.handshake {
            // No handshake (AMD): the plugin lives while the Node advertises
            // its count resource (HAMi's `CheckHealth`).
            None => {
                if !advertises(allocatable, &source.count_resource) {
                    view.unadvertised
                        .push((register.clone(), source.count_resource.clone()));
                    continue;
                }
            }
            Some(key) => match handshake(annotations.get(key), now) {
                Handshake::Answered => {
                    view.handshakes
                        .push((key.clone(), format!("Requesting_{}", stamp(now))));
                }
                Handshake::Waiting => {}
                Handshake::Expired if advertises(allocatable, &source.count_resource) => {}
                Handshake::Expired => {
                    view.expired.push(key.clone());
                    continue;
                }
            },
        }
        let decoded = if source.kind == SourceKind::Json {
            decode_json(value)
        } else {
            decode_csv(value)
        };
        match decoded {
            Ok(devices) => add(&mut view, devices, source, soft_split, reserved),
            Err(error) => view.malformed.push((register.clone(), error)),
        }
    }
    // A GpuNode holds at most 64 devices (the CRD refuses more).
    let cap = super::register::MAX_DEVICES;
    if view.devices.len() > cap {
        view.malformed.push((
            "(all sources)".to_owned(),
            format!(
                "report {} devices together, more than the {cap} a GpuNode holds; the rest are ignored",
                view.devices.len()
            ),
        ));
        view.devices.truncate(cap);
    }
    // HAMi's per-GPU cordon, for every family here (HAMi reads it for
    // NVIDIA only).
    tessera_api::cordon::mark(
        &mut view.devices,
        Some(annotations),
        &Default::default(),
        None,
    );
    any.then_some(view)
}

/// MetaX's whole-GPU topology maps, merged by device count; a malformed
/// one is reported and ignored.
fn placement_scores(view: &mut VendorView, annotations: &BTreeMap<String, String>) {
    let mut read = |key: &str| match annotations.get(key).map(|v| decode_count_map(v)) {
        None => BTreeMap::new(),
        Some(Ok(map)) => map,
        Some(Err(error)) => {
            view.malformed.push((key.to_owned(), error));
            BTreeMap::new()
        }
    };
    let losses = read(metax::TOPOLOGY_LOSSES);
    let scores = read(metax::TOPOLOGY_SCORES);
    let counts: std::collections::BTreeSet<u32> =
        losses.keys().chain(scores.keys()).copied().collect();
    view.placement_scores = counts
        .into_iter()
        .map(|devices| PlacementScore {
            devices,
            loss: losses.get(&devices).copied(),
            score: scores.get(&devices).copied(),
        })
        .collect();
}

/// The GpuNode status for a view: its devices and a `Ready` condition that
/// names what is missing. `previous` keeps transition times of conditions
/// that did not change.
pub fn status(
    view: &VendorView,
    previous: Option<&GpuNodeStatus>,
    now: Timestamp,
) -> GpuNodeStatus {
    let mut status = GpuNodeStatus::of_devices(view.devices.clone());
    status.placement_scores = view.placement_scores.clone();
    let previous = previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == "Ready"));
    status.conditions = vec![condition(view, "Ready", previous, now)];
    status
}

/// The condition of type `type_` saying whether the vendor's plugins
/// registered devices and answer, and what was ignored; its transition time
/// is `previous`'s while the state is the same.
pub fn condition(
    view: &VendorView,
    type_: &str,
    previous: Option<&Condition>,
    now: Timestamp,
) -> Condition {
    let mut problems: Vec<String> = view
        .malformed
        .iter()
        .map(|(key, error)| {
            if [metax::TOPOLOGY_LOSSES, metax::TOPOLOGY_SCORES].contains(&key.as_str()) {
                format!("annotation {key} {error}; the node's GPUs are scored without it")
            } else {
                format!("annotation {key} {error}; its devices are ignored")
            }
        })
        .collect();
    problems.extend(
        view.collisions
            .iter()
            .map(|(key, id)| collision_message(key, id)),
    );
    problems.extend(view.expired.iter().map(|key| {
        format!("the device plugin has not answered the {key} handshake for 60 s; its devices are dropped")
    }));
    problems.extend(view.unadvertised.iter().map(|(key, resource)| {
        format!("annotation {key} is set but the node advertises no {resource}, so the device plugin is gone; its devices are dropped")
    }));
    let (state, reason) = match (view.devices.is_empty(), problems.is_empty()) {
        (false, true) => ("True", "VendorPluginRegistered"),
        (false, false) => ("True", "SomeSourcesIgnored"),
        (true, _) if !view.malformed.is_empty() => ("False", "RegisterAnnotationMalformed"),
        (true, _) if view.expired.is_empty() && !view.unadvertised.is_empty() => {
            ("False", "DevicePluginGone")
        }
        (true, _) => ("False", "HandshakeExpired"),
    };
    let message = if problems.is_empty() {
        "the vendor's device plugin registered the devices and answers the handshake".to_owned()
    } else {
        problems.join("; ")
    };
    let since = previous
        .filter(|c| c.status == state)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: state.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: None,
    }
}

/// Adds a source's devices, skipping ids another source already gave and
/// dropping (as collisions) ids the node's agent publishes.
fn add(
    view: &mut VendorView,
    devices: Vec<Registered>,
    source: &Source,
    soft_split: bool,
    reserved: &BTreeSet<String>,
) {
    let mut cards: Vec<String> = Vec::new();
    for mut d in devices {
        if let Some(card) = d.card.take().filter(|_| source.dies_by_card)
            && d.network_id.is_none()
        {
            let known = cards.iter().position(|c| *c == card).unwrap_or_else(|| {
                cards.push(card);
                cards.len() - 1
            });
            d.network_id = u32::try_from(known).ok();
        }
        if !view.devices.iter().any(|known| known.uuid == d.id) {
            extend(view, [device(d, source, soft_split)], source, reserved);
        }
    }
}

/// Adds devices of `source`, but none whose id the node's agent publishes:
/// those are recorded as collisions under the source's annotation.
fn extend(
    view: &mut VendorView,
    devices: impl IntoIterator<Item = GpuDevice>,
    source: &Source,
    reserved: &BTreeSet<String>,
) {
    for d in devices {
        if reserved.contains(&d.uuid) {
            let key = source.register.as_ref().unwrap_or(&source.count_resource);
            view.collisions.push((key.clone(), d.uuid));
        } else {
            view.devices.push(d);
        }
    }
}

/// What a collision is reported as: the Warning event's and the vendor
/// condition's words for it.
pub fn collision_message(annotation: &str, id: &str) -> String {
    format!(
        "annotation {annotation} names device {id:?}, which the node agent publishes as one of its GPUs; that device is ignored"
    )
}

fn device(d: Registered, source: &Source, soft_split: bool) -> GpuDevice {
    let ascend = source.npu_templates;
    GpuDevice {
        uuid: d.id,
        index: d.index,
        family: source.family,
        network_id: d.network_id,
        qos_policy: d.qos_policy,
        model: source.device_type.clone().unwrap_or(d.device_type),
        memory_mib: d.memory_mib,
        capacity: DeviceCapacity {
            memory_mib: d.memory_mib,
            // Ascend reports AI cores; requests count percent (HAMi's
            // effective total is 100).
            cores: match source.cores {
                Some(cores) => cores,
                None if ascend => 100,
                None => d.cores,
            },
        },
        split_count: d.count,
        numa_node: d.numa,
        health: if d.healthy {
            DeviceHealth::Healthy
        } else {
            DeviceHealth::Unhealthy
        },
        // Ascend: the driver's vNPU templates are a hard split (as MIG is);
        // hami-vnpu-core is HAMi's soft split.
        mode: if ascend && !soft_split {
            OperatingMode::Mig
        } else {
            OperatingMode::HamiCore
        },
        ..GpuDevice::default()
    }
}

enum Handshake {
    /// The plugin answered (or no handshake yet): ask again.
    Answered,
    /// Asked less than 60 s ago (or at a time that cannot be read).
    Waiting,
    /// Asked more than 60 s ago and not answered.
    Expired,
}

fn handshake(value: Option<&String>, now: Timestamp) -> Handshake {
    let Some(value) = value.filter(|v| v.contains("Requesting")) else {
        return Handshake::Answered;
    };
    let Some(asked) = value.split_once('_').and_then(|(_, t)| parse_stamp(t)) else {
        return Handshake::Waiting;
    };
    if now.duration_since(asked) > HANDSHAKE_TIMEOUT {
        Handshake::Expired
    } else {
        Handshake::Waiting
    }
}

/// A resource's whole quantity; 0 when absent or not a whole number.
fn whole(allocatable: &BTreeMap<String, Quantity>, resource: &str) -> u64 {
    allocatable
        .get(resource)
        .and_then(|q| tessera_api::quantity::whole(&q.0).ok())
        .unwrap_or(0)
}

/// The Node's name as devices of an allocatable source are named after it
/// (HAMi: `<node>-cambricon-mlu-<i>`); the view gets it as a pseudo annotation.
fn node_name(annotations: &BTreeMap<String, String>) -> &str {
    let name = annotations.get(NODE_NAME).map_or("node", String::as_str);
    // Ids are at most 128 characters; node names may have 253.
    name.get(..100).unwrap_or(name)
}

/// The key [`view`] reads the Node's name from (never a real annotation: it
/// has no `/`, and the reconciler inserts it).
pub const NODE_NAME: &str = "node-name";

/// The key [`view`] reads the Node's `node.kubernetes.io/instance-type`
/// label from (inserted by the reconciler, like [`NODE_NAME`]).
pub const INSTANCE_TYPE: &str = "node-instance-type";

/// NeuronCores one Neuron device offers at most (the cores a slice can
/// name by index).
const MAX_CORES_PER_DEVICE: u64 = 8;

/// What each card of an allocatable source offers.
struct Card {
    /// Its memory, MiB.
    memory_mib: u64,
    /// Its cores (Cambricon and MetaX 100, Moore Threads 16).
    cores: u32,
    /// How many containers may share it.
    split_count: u32,
}

/// `cards` devices like `card`, named `<prefix>-<i>`, healthy (the plugin's
/// allocatable is the health signal: an unhealthy card leaves it); at most
/// [`super::register::MAX_DEVICES`].
fn cards_of(prefix: &str, cards: u64, card: &Card, source: &Source) -> Vec<GpuDevice> {
    let cards = cards.min(u64::try_from(super::register::MAX_DEVICES).unwrap_or(64));
    (0..cards)
        .map(|i| GpuDevice {
            uuid: format!("{prefix}-{i}"),
            index: u32::try_from(i).unwrap_or(u32::MAX),
            family: source.family,
            model: source.device_type.clone().unwrap_or_default(),
            memory_mib: card.memory_mib,
            capacity: DeviceCapacity {
                memory_mib: card.memory_mib,
                cores: card.cores,
            },
            split_count: card.split_count,
            health: DeviceHealth::Healthy,
            mode: OperatingMode::HamiCore,
            ..GpuDevice::default()
        })
        .collect()
}

/// Enflame's DRS GCUs as HAMi lists them: `<node>-enflame-drs-<index>`,
/// the largest profile's memory, 100 cores, as many shares as DRS slices,
/// and the node's profiles.
fn drs_gcus(node: &str, drs: &DrsNode, source: &Source) -> Vec<GpuDevice> {
    let memory_mib = u64::from(drs.memory_gb) * 1024;
    let profiles: Vec<DeviceProfile> = drs
        .profiles
        .iter()
        .map(|(name, id)| DeviceProfile {
            name: name.clone(),
            id: id.clone(),
        })
        .collect();
    drs.gcus
        .iter()
        .map(|gcu| GpuDevice {
            uuid: format!("{node}-enflame-drs-{}", gcu.index),
            index: gcu.index,
            family: source.family,
            model: enflame::DRS_TYPE.into(),
            memory_mib,
            capacity: DeviceCapacity {
                memory_mib,
                cores: 100,
            },
            split_count: gcu.capacity,
            health: DeviceHealth::Healthy,
            mode: OperatingMode::HamiCore,
            profiles: profiles.clone(),
            minor: Some(gcu.minor.clone()),
            ..GpuDevice::default()
        })
        .collect()
}

fn advertises(allocatable: &BTreeMap<String, Quantity>, resource: &str) -> bool {
    allocatable
        .get(resource)
        .is_some_and(|q| !matches!(q.0.trim(), "" | "0"))
}

/// `now` as HAMi writes handshake times, in UTC.
pub fn stamp(now: Timestamp) -> String {
    now.to_zoned(TimeZone::UTC)
        .strftime(HANDSHAKE_FORMAT)
        .to_string()
}

fn parse_stamp(text: &str) -> Option<Timestamp> {
    DateTime::strptime(HANDSHAKE_FORMAT, text.trim())
        .ok()?
        .to_zoned(TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

#[cfg(test)]
mod tests {
    use tessera_scheduling::request::{HygonConfig, VnpuConfig, VnpusConfig};

    use super::*;
    use tessera_api::{
        names::hygon,
        v1alpha1::{DeviceFamily, QosPolicy},
    };

    fn config() -> RequestConfig {
        RequestConfig {
            hygon: Some(HygonConfig::default()),
            vnpus: Some(VnpusConfig {
                hami_vnpu_core: false,
                configs: vec![VnpuConfig {
                    common_word: "Ascend910B4".into(),
                    resource_name: "huawei.com/Ascend910B4".into(),
                    resource_memory_name: "huawei.com/Ascend910B4-memory".into(),
                    memory_allocatable: 32768,
                    memory_capacity: 32768,
                    ..VnpuConfig::default()
                }],
            }),
            ..RequestConfig::default()
        }
    }

    /// The view of a Node with `annotations` and `allocatable` under the
    /// sources of `config` at `now`, without hami-vnpu-core, beside an
    /// agent that publishes no device.
    fn view_at(
        annotations: &BTreeMap<String, String>,
        allocatable: &BTreeMap<String, Quantity>,
        config: &RequestConfig,
        now: Timestamp,
    ) -> Option<VendorView> {
        view(
            annotations,
            allocatable,
            &sources(config),
            false,
            &BTreeSet::new(),
            now,
        )
    }

    /// The view of a Node with `annotations` and `allocatable` under the
    /// sources of `config`, now, without hami-vnpu-core by default.
    fn view_now(
        annotations: &BTreeMap<String, String>,
        allocatable: &BTreeMap<String, Quantity>,
        config: &RequestConfig,
    ) -> Option<VendorView> {
        view_at(annotations, allocatable, config, Timestamp::now())
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    const ASCEND: &str = r#"[{"id":"NPU-0","count":4,"devmem":32768,"devcore":20,"type":"Ascend910B4","health":true,"custominfo":{"NetworkID":1}}]"#;

    #[test]
    fn cambricon_cards_come_from_the_nodes_allocatable() {
        let config = RequestConfig {
            cambricon: Some(tessera_scheduling::request::CambriconConfig::default()),
            ..RequestConfig::default()
        };
        let allocatable = BTreeMap::from([
            (
                "cambricon.com/mlu.smlu.vcore".to_owned(),
                Quantity("200".into()),
            ),
            (
                "cambricon.com/mlu.smlu.vmemory".to_owned(),
                Quantity("128".into()),
            ),
        ]);
        let node = annotations(&[(NODE_NAME, "mlu-1")]);
        let seen = view_now(&node, &allocatable, &config).unwrap();
        assert_eq!(seen.devices.len(), 2);
        let d = &seen.devices[1];
        assert_eq!(
            (
                d.uuid.as_str(),
                d.family,
                d.model.as_str(),
                d.capacity.memory_mib,
                d.capacity.cores,
                d.split_count
            ),
            (
                "mlu-1-cambricon-mlu-1",
                DeviceFamily::Cambricon,
                "MLU",
                16384,
                100,
                100
            )
        );
        assert!(seen.handshakes.is_empty(), "Cambricon has no handshake");
        let none = BTreeMap::from([(
            "cambricon.com/mlu.smlu.vcore".to_owned(),
            Quantity("0".into()),
        )]);
        assert_eq!(
            view(
                &node,
                &none,
                &sources(&config),
                false,
                &BTreeSet::new(),
                Timestamp::now()
            ),
            None
        );
    }

    #[test]
    fn more_cards_than_a_gpunode_holds_keep_each_cards_own_memory() {
        // 100 MLUs of 16 GiB: 64 are listed, each still with 16 GiB (not
        // the whole node's memory spread over the 64).
        let config = RequestConfig {
            cambricon: Some(tessera_scheduling::request::CambriconConfig::default()),
            ..RequestConfig::default()
        };
        let allocatable = BTreeMap::from([
            (
                "cambricon.com/mlu.smlu.vcore".to_owned(),
                Quantity("10000".into()),
            ),
            (
                "cambricon.com/mlu.smlu.vmemory".to_owned(),
                Quantity("6400".into()),
            ),
        ]);
        let node = annotations(&[(NODE_NAME, "mlu-big")]);
        let seen = view_now(&node, &allocatable, &config).unwrap();
        assert_eq!(seen.devices.len(), 64);
        assert!(seen.devices.iter().all(|d| d.capacity.memory_mib == 16384));
    }

    #[test]
    fn moore_threads_cards_are_sixteen_cores_each() {
        let config = RequestConfig {
            mthreads: Some(tessera_scheduling::request::MthreadsConfig::default()),
            ..RequestConfig::default()
        };
        let allocatable = BTreeMap::from([
            ("mthreads.com/sgpu-core".to_owned(), Quantity("32".into())),
            (
                "mthreads.com/sgpu-memory".to_owned(),
                Quantity("192".into()),
            ),
        ]);
        let node = annotations(&[(NODE_NAME, "mt-1")]);
        let seen = view_now(&node, &allocatable, &config).unwrap();
        let d = &seen.devices[1];
        assert_eq!(
            (
                seen.devices.len(),
                d.uuid.as_str(),
                d.capacity.memory_mib,
                d.capacity.cores,
                d.split_count
            ),
            (2, "mt-1-mthreads-1", 49152, 16, 100)
        );
    }

    #[test]
    fn metax_gpus_come_from_the_count_and_sgpus_from_the_plugins_list() {
        let config = RequestConfig {
            metax: Some(tessera_scheduling::request::MetaxConfig::default()),
            ..RequestConfig::default()
        };
        // Whole GPUs: HAMi's TestGetNodeDevices (capacity 2: two 64 GiB cards).
        let allocatable = BTreeMap::from([("metax-tech.com/gpu".to_owned(), Quantity("2".into()))]);
        let node = annotations(&[(NODE_NAME, "mx-1")]);
        let seen = view_now(&node, &allocatable, &config).unwrap();
        let shape = |d: &GpuDevice| {
            (
                d.uuid.clone(),
                d.model.clone(),
                d.capacity.memory_mib,
                d.capacity.cores,
                d.split_count,
                d.network_id,
                d.health,
            )
        };
        assert_eq!(
            seen.devices.iter().map(shape).collect::<Vec<_>>(),
            [
                (
                    "mx-1-metax-0".into(),
                    "Metax-GPU".into(),
                    65536,
                    100,
                    1,
                    None,
                    DeviceHealth::Healthy
                ),
                (
                    "mx-1-metax-1".into(),
                    "Metax-GPU".into(),
                    65536,
                    100,
                    1,
                    None,
                    DeviceHealth::Healthy
                ),
            ]
        );
        // sGPUs: HAMi's TestGetMetaxSDevices list, a MetaLink on the first.
        let list = r#"[{"uuid":"GPU-123","bdf":"0000:3f:00.0","model":"MXC500","totalDevCount":16,"totalCompute":100,"totalVRam":65536,"numa":0,"healthy":true,"qosPolicy":"best-effort","linkZone":1},
                       {"uuid":"GPU-456","totalDevCount":16,"totalCompute":100,"totalVRam":65536,"numa":1}]"#;
        let node = annotations(&[
            (NODE_NAME, "mx-2"),
            ("metax-tech.com/node-gpu-devices", list),
        ]);
        let seen = view_now(&node, &BTreeMap::new(), &config).unwrap();
        assert_eq!(
            seen.devices.iter().map(shape).collect::<Vec<_>>(),
            [
                (
                    "GPU-123".into(),
                    "Metax-SGPU".into(),
                    65536,
                    100,
                    16,
                    Some(1),
                    DeviceHealth::Healthy
                ),
                (
                    "GPU-456".into(),
                    "Metax-SGPU".into(),
                    65536,
                    100,
                    16,
                    None,
                    DeviceHealth::Unhealthy
                ),
            ]
        );
        assert_eq!(seen.devices[1].numa_node, Some(1));
        assert_eq!(
            (seen.devices[0].qos_policy, seen.devices[1].qos_policy),
            (Some(QosPolicy::BestEffort), None),
            "the plugin's QoS policy, none when it names none"
        );
        assert!(seen.handshakes.is_empty(), "MetaX has no handshake");
        // A malformed list is reported and ignored (HAMi's Unmarshal fail
        // and empty list rows; a QoS policy MetaX does not have).
        for bad in [
            "{not json",
            "[]",
            r#"[{"uuid":"a,b","totalVRam":1}]"#,
            r#"[{"uuid":"x","totalVRam":-1}]"#,
            r#"[{"uuid":"x","totalVRam":1,"qosPolicy":"gold"}]"#,
        ] {
            let node = annotations(&[
                (NODE_NAME, "mx-3"),
                ("metax-tech.com/node-gpu-devices", bad),
            ]);
            let seen = view_now(&node, &BTreeMap::new(), &config).unwrap();
            assert!(seen.devices.is_empty(), "{bad}");
            assert_eq!(seen.malformed.len(), 1, "{bad}");
            assert_eq!(seen.malformed[0].0, "metax-tech.com/node-gpu-devices");
        }
    }

    #[test]
    fn metax_gpu_topology_maps_become_placement_scores() {
        let config = RequestConfig {
            metax: Some(tessera_scheduling::request::MetaxConfig::default()),
            ..RequestConfig::default()
        };
        let allocatable = BTreeMap::from([("metax-tech.com/gpu".to_owned(), Quantity("4".into()))]);
        let seen = |losses: &str, scores: &str| {
            let node = annotations(&[
                (NODE_NAME, "mx-1"),
                (metax::TOPOLOGY_LOSSES, losses),
                (metax::TOPOLOGY_SCORES, scores),
            ]);
            view_now(&node, &allocatable, &config).unwrap()
        };
        // HAMi's parseMetaxAnnos form: a JSON object from counts to numbers.
        let good = seen(r#"{"1": 0, "2": 10, "4": 30}"#, r#"{"2": 80}"#);
        assert!(good.malformed.is_empty(), "{:?}", good.malformed);
        assert_eq!(
            good.placement_scores,
            [
                PlacementScore {
                    devices: 1,
                    loss: Some(0),
                    score: None
                },
                PlacementScore {
                    devices: 2,
                    loss: Some(10),
                    score: Some(80)
                },
                PlacementScore {
                    devices: 4,
                    loss: Some(30),
                    score: None
                },
            ]
        );
        let written = status(&good, None, Timestamp::now());
        assert_eq!(written.placement_scores.len(), 3);
        // A malformed map is reported by name and ignored; the GPUs stay.
        for bad in [r#"{"x": 1}"#, r#"{"0": 1}"#, r#"{"1": "a"}"#, "[1]"] {
            let got = seen(bad, r#"{"2": 80}"#);
            assert_eq!(got.devices.len(), 4, "{bad}");
            assert_eq!(got.malformed.len(), 1, "{bad}");
            assert_eq!(got.malformed[0].0, metax::TOPOLOGY_LOSSES, "{bad}");
            assert_eq!(got.placement_scores.len(), 1, "{bad}: the scores stay");
            let written = status(&got, None, Timestamp::now());
            let ready = &written.conditions[0];
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                ("True", "SomeSourcesIgnored")
            );
            assert!(
                ready.message.contains("scored without it"),
                "{}",
                ready.message
            );
        }
    }

    #[test]
    fn enflame_gcus_come_from_the_nodes_count() {
        // HAMi's TestGCUDevices_GetNodeDevices: capacity 2, ids
        // `<node>-GCU-<i>`, memory and cores 100, one container each.
        let config = RequestConfig {
            enflame: Some(tessera_scheduling::request::EnflameConfig::default()),
            ..RequestConfig::default()
        };
        let allocatable = BTreeMap::from([("enflame.com/gcu".to_owned(), Quantity("2".into()))]);
        let node = annotations(&[(NODE_NAME, "test-node")]);
        let seen = view_now(&node, &allocatable, &config).unwrap();
        let got: Vec<_> = seen
            .devices
            .iter()
            .map(|d| {
                (
                    d.uuid.as_str(),
                    d.family,
                    d.model.as_str(),
                    d.capacity.memory_mib,
                    d.capacity.cores,
                    d.split_count,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("test-node-GCU-0", DeviceFamily::Enflame, "GCU", 100, 100, 1),
                ("test-node-GCU-1", DeviceFamily::Enflame, "GCU", 100, 100, 1),
            ]
        );
        // "Test with missing resource": no GCUs, no vendor view.
        assert!(
            view(
                &node,
                &BTreeMap::new(),
                &sources(&config),
                false,
                &BTreeSet::new(),
                Timestamp::now()
            )
            .is_none()
        );
    }

    #[test]
    fn vastai_and_biren_devices_come_from_their_json_registers_with_the_handshake() {
        // HAMi's vastai and biren Test_GetNodeDevices: the register as the
        // plugins write it, 100 cores each (HAMi sets Devcore for scoring).
        let config = RequestConfig {
            vastai: Some(tessera_scheduling::request::VastaiConfig::default()),
            biren: Some(tessera_scheduling::request::BirenConfig::default()),
            ..RequestConfig::default()
        };
        let node = annotations(&[
            (
                "hami.io/node-va-register",
                r#"[{"id":"7-0","count":1,"devmem":32768,"type":"Vastai","health":true,"devicepairscore":{}}]"#,
            ),
            ("hami.io/node-handshake-va", "Reported_2026.12.02 10:00:00"),
            (
                "hami.io/node-biren-register",
                r#"[{"id":"card-0","count":1,"devmem":65536,"type":"Biren","health":true}]"#,
            ),
            (
                "hami.io/node-handshake-biren",
                "Reported_2026.12.02 10:00:00",
            ),
        ]);
        let now = Timestamp::now();
        let seen = view_at(&node, &BTreeMap::new(), &config, now).unwrap();
        let devices: Vec<_> = seen
            .devices
            .iter()
            .map(|d| {
                (
                    d.uuid.as_str(),
                    d.family,
                    d.model.as_str(),
                    d.capacity.memory_mib,
                    d.capacity.cores,
                    d.split_count,
                )
            })
            .collect();
        assert_eq!(
            devices,
            [
                ("7-0", DeviceFamily::Vastai, "Vastai", 32768, 100, 1),
                ("card-0", DeviceFamily::Biren, "Biren", 65536, 100, 1),
            ]
        );
        let asked: Vec<_> = seen.handshakes.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            asked,
            ["hami.io/node-handshake-va", "hami.io/node-handshake-biren"]
        );
        // Die mode: each card (`AIC`) is the network of its dies, numbered
        // as the register names them; Biren's source groups nothing.
        let dies = r#"[{"id":"d0","count":1,"type":"Vastai","health":true,"custominfo":{"DeviceStrategy":"die","AIC":"7"}},{"id":"d1","count":1,"type":"Vastai","health":true,"custominfo":{"DeviceStrategy":"die","AIC":"3"}},{"id":"d2","count":1,"type":"Vastai","health":true,"custominfo":{"DeviceStrategy":"die","AIC":"7"}}]"#;
        let node = annotations(&[
            ("hami.io/node-va-register", dies),
            ("hami.io/node-handshake-va", "Reported_2026.12.02 10:00:00"),
            (
                "hami.io/node-biren-register",
                &dies
                    .replace("Vastai", "Biren")
                    .replace(r#""id":"d"#, r#""id":"b"#),
            ),
            (
                "hami.io/node-handshake-biren",
                "Reported_2026.12.02 10:00:00",
            ),
        ]);
        let seen = view_at(&node, &BTreeMap::new(), &config, now).unwrap();
        let networks: Vec<_> = seen
            .devices
            .iter()
            .map(|d| (d.family, d.network_id))
            .collect();
        assert_eq!(
            networks,
            [
                (DeviceFamily::Vastai, Some(0)),
                (DeviceFamily::Vastai, Some(1)),
                (DeviceFamily::Vastai, Some(0)),
                (DeviceFamily::Biren, None),
                (DeviceFamily::Biren, None),
                (DeviceFamily::Biren, None),
            ]
        );
    }

    #[test]
    fn amd_gpus_come_from_the_json_register_while_the_node_advertises_them() {
        // HAMi's amd TestGetNodeDevices, with the product type of
        // docs/develop/amd-vgpu.md (spaces kept) and CUs as cores.
        let config = RequestConfig {
            amd: Some(tessera_scheduling::request::AmdConfig::default()),
            ..RequestConfig::default()
        };
        let register = r#"[{"id":"GPU-0","index":0,"count":4,"devmem":196608,"devcore":304,"type":"AMD Instinct MI300X VF","numa":0,"mode":"hami-core","health":true}]"#;
        let node = annotations(&[("hami.io/node-amd-register", register)]);
        let advertised = BTreeMap::from([("amd.com/gpu".to_owned(), Quantity("1".into()))]);
        let now = Timestamp::now();
        let seen = view_at(&node, &advertised, &config, now).unwrap();
        let d = &seen.devices[0];
        assert_eq!(
            (
                d.uuid.as_str(),
                d.family,
                d.model.as_str(),
                d.capacity.memory_mib,
                d.capacity.cores,
                d.split_count
            ),
            (
                "GPU-0",
                DeviceFamily::Amd,
                "AMD Instinct MI300X VF",
                196608,
                304,
                4
            )
        );
        assert!(
            seen.handshakes.is_empty(),
            "HAMi's AMD plugin has no handshake"
        );
        // CheckHealth: no amd.com/gpu on the Node, the plugin is gone.
        let gone = view_at(&node, &BTreeMap::new(), &config, now).unwrap();
        assert!(gone.devices.is_empty());
        let status = status(&gone, None, now);
        assert_eq!(status.conditions[0].reason, "DevicePluginGone");
        assert!(
            status.conditions[0].message.contains(
                "annotation hami.io/node-amd-register is set but the node advertises no amd.com/gpu"
            ),
            "{}",
            status.conditions[0].message
        );
        // A type that would break the hand-off list is refused.
        let hostile = annotations(&[(
            "hami.io/node-amd-register",
            r#"[{"id":"GPU-0","count":1,"devmem":1,"devcore":1,"type":"MI300X,GPU-9","health":true}]"#,
        )]);
        let seen = view_at(&hostile, &advertised, &config, now).unwrap();
        assert!(seen.devices.is_empty());
        assert!(
            seen.malformed[0].1.contains("device 0: type must be"),
            "{:?}",
            seen.malformed
        );
    }

    #[test]
    fn kunlunxin_xpus_come_from_the_count_and_vxpus_from_the_register() {
        // HAMi's kunlun TestGetNodeDevices (8 whole XPUs of 98304 MiB named
        // `<node>-kunlun-<i>`) and the vXPU plugin's JSON with its handshake.
        let config = RequestConfig {
            kunlun: Some(tessera_scheduling::request::KunlunConfig::default()),
            ..RequestConfig::default()
        };
        let now = Timestamp::now();
        let allocatable = BTreeMap::from([("kunlunxin.com/xpu".to_owned(), Quantity("8".into()))]);
        let node = annotations(&[(NODE_NAME, "n1")]);
        let seen = view_at(&node, &allocatable, &config, now).unwrap();
        assert_eq!(seen.devices.len(), 8);
        let d = &seen.devices[7];
        assert_eq!(
            (
                d.uuid.as_str(),
                d.model.as_str(),
                d.memory_mib,
                d.capacity.cores,
                d.split_count
            ),
            ("n1-kunlun-7", "kunlun", 98304, 100, 1)
        );
        let register = r#"[{"id":"xpu-0","index":0,"count":4,"devmem":98304,"devcore":100,"type":"P800","health":true}]"#;
        let node = annotations(&[("hami.io/node-register-xpu", register)]);
        let seen = view_at(&node, &BTreeMap::new(), &config, now).unwrap();
        let d = &seen.devices[0];
        assert_eq!(
            (d.uuid.as_str(), d.family, d.model.as_str(), d.split_count),
            ("xpu-0", DeviceFamily::Kunlunxin, "XPU", 4)
        );
        assert_eq!(seen.handshakes[0].0, "hami.io/node-handshake-xpu");
    }

    #[test]
    fn aws_neuron_devices_come_from_the_nodes_count_and_cores() {
        // HAMi's awsneuron TestGetNodeDevices: `<node>-AWSNeuron-<i>`,
        // cores per device = neuroncore / neuron, the instance type kept.
        let config = RequestConfig {
            awsneuron: Some(tessera_scheduling::request::AwsNeuronConfig::default()),
            ..RequestConfig::default()
        };
        let allocatable = BTreeMap::from([
            ("aws.amazon.com/neuron".to_owned(), Quantity("2".into())),
            ("aws.amazon.com/neuroncore".to_owned(), Quantity("4".into())),
        ]);
        let node = annotations(&[(NODE_NAME, "n1"), (INSTANCE_TYPE, "inf2.8xlarge")]);
        let seen = view_now(&node, &allocatable, &config).unwrap();
        let got: Vec<_> = seen
            .devices
            .iter()
            .map(|d| {
                (
                    d.uuid.as_str(),
                    d.family,
                    d.model.as_str(),
                    d.memory_mib,
                    d.capacity.cores,
                    d.split_count,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "n1-AWSNeuron-0",
                    DeviceFamily::AwsNeuron,
                    "inf2.8xlarge",
                    0,
                    2,
                    2
                ),
                (
                    "n1-AWSNeuron-1",
                    DeviceFamily::AwsNeuron,
                    "inf2.8xlarge",
                    0,
                    2,
                    2
                ),
            ]
        );
        let unlabelled = annotations(&[(NODE_NAME, "n1")]);
        let seen = view_now(&unlabelled, &allocatable, &config).unwrap();
        assert_eq!(seen.devices[0].model, "AWSNeuron");
    }

    #[test]
    fn enflame_drs_gcus_come_from_the_capacity_annotation() {
        // HAMi's enflame TestGetNodeDevices: `<node>-enflame-drs-<index>`,
        // as many shares as DRS slices, the largest profile's memory.
        let config = RequestConfig {
            enflame: Some(tessera_scheduling::request::EnflameConfig::default()),
            ..RequestConfig::default()
        };
        let drs = r#"{"devices":[{"index":"0","minor":"0","capacity":6}],"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}"#;
        let node = annotations(&[(NODE_NAME, "node-a"), ("enflame.com/gcu-drs-capacity", drs)]);
        let seen = view_now(&node, &BTreeMap::new(), &config).unwrap();
        let d = &seen.devices[0];
        assert_eq!(
            (
                d.uuid.as_str(),
                d.model.as_str(),
                d.memory_mib,
                d.capacity.cores,
                d.split_count,
                d.minor.as_deref()
            ),
            ("node-a-enflame-drs-0", "Enflame", 40960, 100, 6, Some("0"))
        );
        let names: Vec<(&str, &str)> = d
            .profiles
            .iter()
            .map(|p| (p.name.as_str(), p.id.as_str()))
            .collect();
        assert_eq!(names, [("1g.6gb", "0"), ("3g.20gb", "1"), ("6g.40gb", "2")]);
        for (bad, why) in [
            (
                r#"{"devices":[{"index":"0","capacity":6}],"profiles":{"big":"0"}}"#,
                "names no profile HAMi can read",
            ),
            (
                r#"{"devices":[{"index":"0","capacity":0}],"profiles":{"1g.6gb":"0"}}"#,
                "capacity 0 is not 1 to 64 slices",
            ),
            (
                r#"{"devices":[{"index":"0","capacity":"x"}],"profiles":{"1g.6gb":"0"}}"#,
                "is not 1 to 64 slices",
            ),
            (
                r#"{"devices":[],"profiles":{"1g.6gb":"0"}}"#,
                "lists no device",
            ),
            (
                r#"{"devices":[{"index":"0","minor":"0,1","capacity":6}],"profiles":{"1g.6gb":"0"}}"#,
                "minor must be",
            ),
            (r#""drs""#, "is not HAMi's DRS capacity object"),
        ] {
            let node = annotations(&[(NODE_NAME, "node-a"), ("enflame.com/gcu-drs-capacity", bad)]);
            let seen = view_now(&node, &BTreeMap::new(), &config).unwrap();
            assert!(seen.devices.is_empty(), "{bad}");
            assert!(
                seen.malformed[0].1.contains(why),
                "{bad}: {:?}",
                seen.malformed
            );
        }
    }

    #[test]
    fn iluvatar_chips_register_in_csv_under_their_own_key() {
        let config = RequestConfig {
            iluvatars: vec![tessera_scheduling::request::IluvatarConfig {
                common_word: "MR-V100".into(),
                resource_count_name: "iluvatar.ai/MR-V100-vgpu".into(),
                resource_memory_name: "iluvatar.ai/MR-V100.vMem".into(),
                ..Default::default()
            }],
            ..RequestConfig::default()
        };
        let node = annotations(&[(
            "hami.io/node-MR-V100-register",
            "ilu-0,8,32768,100,MR-V100,0,true,0,hami-core:",
        )]);
        let seen = view_now(&node, &BTreeMap::new(), &config).unwrap();
        let d = &seen.devices[0];
        assert_eq!(
            (d.family, d.model.as_str(), d.capacity.cores, d.split_count),
            (DeviceFamily::Iluvatar, "MR-V100", 100, 8)
        );
        assert_eq!(seen.handshakes[0].0, "hami.io/node-handshake-MR-V100");
    }

    #[test]
    fn a_node_without_vendor_annotations_has_no_vendor_view() {
        let sources = sources(&config());
        let plain = annotations(&[("tessera.dev/gpu-ready", "True")]);
        assert_eq!(
            view(
                &plain,
                &BTreeMap::new(),
                &sources,
                false,
                &BTreeSet::new(),
                Timestamp::now()
            ),
            None
        );
    }

    #[test]
    fn both_families_become_devices_and_a_handshake_is_asked_for() {
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let node = annotations(&[
            (
                hygon::REGISTER,
                "DCU-0,4,16384,100,DCU-Z100,0,true,0,hami-core:",
            ),
            (hygon::HANDSHAKE, "Reported_2026-11-27 09:59:50"),
            ("hami.io/node-register-Ascend910B4", ASCEND),
        ]);
        let seen = view_at(&node, &BTreeMap::new(), &config(), now).unwrap();
        assert_eq!(seen.devices.len(), 2);
        let dcu = &seen.devices[0];
        assert_eq!(
            (
                dcu.family,
                dcu.model.as_str(),
                dcu.capacity.cores,
                dcu.split_count
            ),
            (DeviceFamily::Hygon, "DCU-Z100", 100, 4)
        );
        let npu = &seen.devices[1];
        assert_eq!(
            (
                npu.family,
                npu.model.as_str(),
                npu.capacity.cores,
                npu.network_id,
                npu.mode
            ),
            (
                DeviceFamily::Ascend,
                "Ascend910B4",
                100,
                Some(1),
                OperatingMode::Mig
            )
        );
        assert_eq!(
            seen.handshakes,
            vec![
                (
                    hygon::HANDSHAKE.to_owned(),
                    "Requesting_2026-11-27 10:00:00".to_owned()
                ),
                (
                    "hami.io/node-handshake-Ascend910B4".to_owned(),
                    "Requesting_2026-11-27 10:00:00".to_owned()
                ),
            ]
        );
        let status = status(&seen, None, now);
        assert_eq!(
            (status.gpu_count, status.conditions[0].status.as_str()),
            (2, "True")
        );
        assert!(seen.devices.iter().all(|d| d.cordoned_by.is_none()));

        // hami.io/device-cordon closes the DCU to new pods, here as for NVIDIA.
        let mut cordoned = node.clone();
        cordoned.insert("hami.io/device-cordon".into(), "DCU-0, ".into());
        let seen = view_at(&cordoned, &BTreeMap::new(), &config(), now).unwrap();
        let by: Vec<Option<&str>> = seen
            .devices
            .iter()
            .map(|d| d.cordoned_by.as_deref())
            .collect();
        assert_eq!(by, [Some("hami.io/device-cordon"), None]);
    }

    #[test]
    fn an_unanswered_handshake_drops_the_source_after_60_s_unless_still_advertised() {
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let node = annotations(&[
            (hygon::REGISTER, "DCU-0,4,16384,100,DCU,0,true:"),
            (hygon::HANDSHAKE, "Requesting_2026-11-27 09:58:59"),
        ]);
        let gone = view_at(&node, &BTreeMap::new(), &config(), now).unwrap();
        assert!(gone.devices.is_empty());
        assert_eq!(gone.expired, vec![hygon::HANDSHAKE.to_owned()]);
        assert!(gone.handshakes.is_empty(), "no new request while one waits");
        let status = status(&gone, None, now);
        assert_eq!(
            (
                status.conditions[0].status.as_str(),
                status.conditions[0].reason.as_str()
            ),
            ("False", "HandshakeExpired")
        );

        let advertised = BTreeMap::from([("hygon.com/dcunum".to_owned(), Quantity("4".into()))]);
        assert_eq!(
            view_at(&node, &advertised, &config(), now)
                .unwrap()
                .devices
                .len(),
            1
        );

        let recent = annotations(&[
            (hygon::REGISTER, "DCU-0,4,16384,100,DCU,0,true:"),
            (hygon::HANDSHAKE, "Requesting_2026-11-27 09:59:30"),
        ]);
        let waiting = view_at(&recent, &BTreeMap::new(), &config(), now).unwrap();
        assert_eq!((waiting.devices.len(), waiting.handshakes.len()), (1, 0));
    }

    #[test]
    fn a_malformed_source_is_reported_and_ignored_while_the_others_count() {
        let node = annotations(&[
            (hygon::REGISTER, "garbage"),
            ("hami.io/node-register-Ascend910B4", ASCEND),
            (NODE_SOFT_SPLIT, "true"),
        ]);
        let seen = view_at(&node, &BTreeMap::new(), &config(), Timestamp::now()).unwrap();
        assert_eq!(seen.devices.len(), 1);
        assert_eq!(
            seen.devices[0].mode,
            OperatingMode::HamiCore,
            "the node runs hami-vnpu-core"
        );
        assert_eq!(seen.malformed[0].0, hygon::REGISTER);
        let status = status(&seen, None, Timestamp::now());
        assert_eq!(status.conditions[0].reason, "SomeSourcesIgnored");
        assert!(
            status.conditions[0]
                .message
                .contains("hami.io/node-dcu-register has no ':'"),
            "{}",
            status.conditions[0].message
        );
    }
}
