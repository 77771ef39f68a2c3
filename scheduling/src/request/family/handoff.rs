//! What a vendor's device plugin reads at Allocate, in HAMi's exact
//! encodings (`pkg/device/devices.go` `EncodePodSingleDevice`,
//! `pkg/scheduler/scheduler.go` `Bind`, `pkg/util/nodelock`, each vendor's
//! `PatchAnnotations`): the plugin finds the pod by `hami.io/vgpu-node` and
//! `hami.io/bind-phase: allocating`, reads its devices from
//! `hami.io/<x>-devices-to-allocate` (Ascend also `huawei.com/<chip>`), sets
//! `bind-phase` to `success` and deletes the Node's `hami.io/mutex.lock`.
//!
//! Each family writes its own keys ([`Family::hand_off`](super::Family::hand_off))
//! with the helpers here; [`Registry::hand_off`](super::Registry::hand_off)
//! hands every slice of an allocation to the family that claims it and adds
//! the keys every vendor plugin reads.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::Pod,
    jiff::{Timestamp, tz::TimeZone},
};
use tessera_api::{
    names::handoff::MUTEX_LOCK,
    v1alpha1::{DeviceSlice, VgpuAllocationSpec},
};

/// What Bind knows when it writes the hand-off: the allocation, the pod and
/// the node's devices.
#[derive(Clone, Copy, Debug)]
pub struct Binding<'a> {
    /// The allocation Bind records.
    pub spec: &'a VgpuAllocationSpec,
    /// The pod's container names in kubelet order ([`container_order`]):
    /// HAMi's encoding keeps one `;`-ended entry per container, empty where
    /// a container has no device of that type.
    pub containers: &'a [String],
    /// What the hand-off reads of the node's devices (Neuron's cores per
    /// device, Enflame's profiles and minors).
    pub devices: &'a [NodeDevice<'a>],
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's name.
    pub pod: &'a str,
    /// When Bind writes.
    pub now: Timestamp,
}

impl<'a> Binding<'a> {
    /// Every slice of the allocation.
    pub fn slices(&self) -> impl Iterator<Item = &'a DeviceSlice> + 'a {
        self.spec.containers.iter().flat_map(|c| &c.devices)
    }

    /// Whether any slice is one `keep` selects.
    pub fn any(&self, keep: impl Fn(&DeviceSlice) -> bool) -> bool {
        self.slices().any(keep)
    }

    /// The slices of the container `name` that `keep` selects.
    pub fn slices_of(
        &self,
        name: &str,
        keep: impl Fn(&DeviceSlice) -> bool,
    ) -> Vec<&'a DeviceSlice> {
        self.spec
            .containers
            .iter()
            .filter(|c| c.name == name)
            .flat_map(|c| &c.devices)
            .filter(|d| keep(d))
            .collect()
    }

    /// The slices `keep` selects, container by container in kubelet order.
    pub fn per_container(
        &self,
        keep: impl Fn(&DeviceSlice) -> bool + Copy,
    ) -> Vec<(&'a str, Vec<&'a DeviceSlice>)> {
        self.containers
            .iter()
            .map(|name| (name.as_str(), self.slices_of(name, keep)))
            .collect()
    }

    /// HAMi's list of the slices `keep` selects (`EncodePodSingleDevice`):
    /// `<uuid>,<type>,<MiB>,<cores>:` per slice and a `;` after each
    /// container, with `shown` the type each is written with.
    pub fn encode<S: std::fmt::Display>(
        &self,
        keep: impl Fn(&DeviceSlice) -> bool + Copy,
        shown: impl Fn(&DeviceSlice) -> S,
        cores: impl Fn(&DeviceSlice) -> u32,
    ) -> String {
        let mut encoded = String::new();
        for (_, slices) in self.per_container(keep) {
            for d in slices {
                encoded.push_str(&format!(
                    "{},{},{},{}:",
                    d.uuid,
                    shown(d),
                    d.memory_mib,
                    cores(d)
                ));
            }
            encoded.push(';');
        }
        encoded
    }

    /// HAMi's list for devices that are counted, not measured (Vastai,
    /// Biren): each slice `keep` selects written as `<uuid>,<shown>,0,0:`,
    /// the memory and cores HAMi's `Fit` leaves unset.
    pub fn encode_counted(
        &self,
        keep: impl Fn(&DeviceSlice) -> bool + Copy,
        shown: &str,
    ) -> String {
        let mut encoded = String::new();
        for (_, slices) in self.per_container(keep) {
            for d in slices {
                encoded.push_str(&format!("{},{shown},0,0:", d.uuid));
            }
            encoded.push(';');
        }
        encoded
    }

    /// The card indexes of the last container with a slice `keep` selects,
    /// comma-separated (what the whole-card plugins of Moore Threads and
    /// Kunlunxin read).
    pub fn last_indexes(&self, keep: impl Fn(&DeviceSlice) -> bool + Copy) -> Option<String> {
        self.per_container(keep)
            .into_iter()
            .rev()
            .find_map(|(_, slices)| {
                (!slices.is_empty()).then(|| {
                    slices
                        .iter()
                        .map(|d| d.index.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                })
            })
    }

    /// The node's device `uuid`.
    pub fn device(&self, uuid: &str) -> Option<&'a NodeDevice<'a>> {
        self.devices.iter().find(|d| d.uuid == uuid)
    }

    /// Bind's time in seconds since the epoch, as HAMi writes `bind-time`.
    pub fn seconds(&self) -> String {
        self.now.as_second().to_string()
    }

    /// Bind's time in nanoseconds since the epoch (the vendors' own
    /// predicate times).
    pub fn nanoseconds(&self) -> String {
        self.now.as_nanosecond().to_string()
    }

    /// Bind's time as HAMi's locks write it (`2006-01-02T15:04:05Z`).
    pub fn lock_time(&self) -> String {
        lock_time(self.now)
    }
}

/// What the hand-off reads of one of the node's devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDevice<'a> {
    /// The device's id.
    pub uuid: &'a str,
    /// Its schedulable cores (a Neuron device's NeuronCores).
    pub cores: u32,
    /// Its minor number, where its plugin is handed it (Enflame).
    pub minor: Option<&'a str>,
    /// The partition profiles its plugin cuts it into: (name, the plugin's
    /// id).
    pub profiles: Vec<(&'a str, &'a str)>,
}

/// The annotations Bind writes for a vendor plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    /// On the pod.
    pub pod: BTreeMap<String, String>,
    /// On the Node.
    pub node: BTreeMap<String, String>,
    /// Slices no enabled family claims (the configuration changed since
    /// Filter): their uuids. Bind refuses such an allocation rather than
    /// hand a plugin nothing.
    pub unclaimed: Vec<String>,
}

impl Handoff {
    /// Whether there is anything to hand over (a pod of NVIDIA GPUs only: no).
    pub fn is_empty(&self) -> bool {
        self.pod.is_empty() && self.node.is_empty()
    }

    /// Sets the pod annotation `key`.
    pub fn pod(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.pod.insert(key.into(), value.into());
    }

    /// HAMi's two lists of one device type, `hami.io/<word>-devices-to-allocate`
    /// (what the plugin reads) and `hami.io/<word>-devices-allocated` (the
    /// copy HAMi keeps for itself).
    pub fn lists(&mut self, word: &str, encoded: String) {
        self.pod(
            format!("hami.io/{word}-devices-to-allocate"),
            encoded.clone(),
        );
        self.allocated(word, encoded);
    }

    /// Only `hami.io/<word>-devices-allocated` (the plugins that read card
    /// indexes instead).
    pub fn allocated(&mut self, word: &str, encoded: String) {
        self.pod(format!("hami.io/{word}-devices-allocated"), encoded);
    }

    /// The Node's `hami.io/mutex.lock`, for the plugins that find their pod
    /// through it.
    pub fn mutex_lock(&mut self, binding: &Binding<'_>) {
        self.node.insert(
            MUTEX_LOCK.to_owned(),
            mutex_value(binding.namespace, binding.pod, binding.now),
        );
    }
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

/// `now` as HAMi's locks write it (`2006-01-02T15:04:05Z`, UTC).
pub fn lock_time(now: Timestamp) -> String {
    now.to_zoned(TimeZone::UTC)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The Node lock value for a pod, as HAMi's `GenerateNodeLockKeyByPod`.
pub fn mutex_value(namespace: &str, pod: &str, now: Timestamp) -> String {
    format!("{},{namespace},{pod}", lock_time(now))
}

/// Whether a Node lock value names this pod (HAMi's owner check: the
/// value ends with `,<namespace>,<pod>`).
pub fn mutex_held_by(value: &str, namespace: &str, pod: &str) -> bool {
    value.ends_with(&format!(",{namespace},{pod}"))
}

/// Go's `omitempty` for a number.
pub(super) fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
