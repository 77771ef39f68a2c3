//! An accelerator family as a plug-in: one [`Family`] per section of the
//! configuration (HAMi's ConfigMap sections keep their serde shape), and a
//! [`Registry`] of the families a configuration enables, built in one place
//! ([`RequestConfig::families`]) so that nothing else enumerates the
//! sections.
//!
//! Each family is a folder: `mod.rs` its [`Family`], `read.rs` its pod
//! reader, `admit.rs` its admission writes where it has any. A family's
//! files import what they use from the request module's shared files
//! (`types`, `config`, `container`'s reader); those files reach the
//! families only through [`RequestConfig::families`], so no import goes
//! back up.
//!
//! What a family answers today:
//!
//! | concern | method | used by |
//! |---|---|---|
//! | which family it is | [`Family::id`] | everything |
//! | the extended resources pods name | [`Family::resources`] | the webhook, kube-scheduler's config, config validation |
//! | a container's request | [`Family::parse`] | [`parse_pod`](super::parse_pod) |
//! | the quota names its slices count against | [`Family::quota`], [`Family::counts_quota`] | [`RequestConfig::quota_names`] |
//! | where its plugin reports devices on a Node | [`Family::sources`] | the controllers' vendor view |
//! | what HAMi's webhook writes for it | [`Family::claims_request`], [`Family::admit_container`], [`Family::admit_pod`] | the webhook, through [`Registry::admit_container`] and [`Registry::admit_pod`] |
//! | what its device plugin reads at Allocate | [`Family::claims`], [`Family::hand_off`] | [`Registry::hand_off`], from Bind |
//!
//! Each family's reader also sets its requests'
//! [`Wording`](crate::request::Wording): how rejections name its devices
//! and the annotations behind its filters. The fit rules and device choice
//! and score still live in `engine/` (behind `VendorRequest`'s flags and
//! checks of [`DeviceFamily`] in `topology.rs`); they move behind this
//! trait next (issue 48). NVIDIA is a family like the others: the
//! configuration's top level (HAMi's `nvidia:` settings) is its section.

#[cfg(test)]
mod admit_tests;
mod ascend;
pub(super) mod biren;
mod enflame;
mod handoff;
#[cfg(test)]
mod handoff_tests;
mod iluvatar;
mod kunlunxin;
mod metax;
mod mthreads;
mod neuron;
mod nvidia;
mod simple;
mod source;
pub(super) mod vastai;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use tessera_api::{
    Violation,
    names::handoff::{BIND_PHASE, BIND_TIME, VGPU_NODE, VGPU_TIME},
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use crate::request::config::RequestConfig;
use crate::request::types::QuotaNames;
use crate::request::types::{ContainerKind, ContainerRequest};

pub use enflame::read::drs_profile;
pub use handoff::{
    Binding, Handoff, NodeDevice, container_order, lock_time, mutex_held_by, mutex_value,
};
pub use source::{Source, SourceKind};

/// A pod's annotations, as the readers take them.
pub type Annotations<'a> = Option<&'a BTreeMap<String, String>>;

/// One accelerator family, as its configuration section enables it.
pub trait Family: Send + Sync {
    /// The family, as the CRDs name it.
    fn id(&self) -> DeviceFamily;

    /// Every extended resource name a pod may ask this family's devices
    /// with (optional names left empty are left out).
    fn resources(&self) -> Vec<&str>;

    /// Reads `container`'s requests for this family into `parsed`: none,
    /// one, or one per kind of device the family has (MetaX GPUs and
    /// sGPUs, Enflame GCUs and DRS partitions, Kunlunxin XPUs and vXPUs),
    /// and every rule the container breaks.
    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    );

    /// The quota names this family's requests count against, one entry per
    /// device type that has names of its own.
    fn quota(&self) -> Vec<Quota<'_>>;

    /// Whether `request` counts against [`Family::quota`] at all (whole
    /// Kunlunxin XPUs and Neuron devices asked for by count do not).
    fn counts_quota(&self, _request: &ContainerRequest) -> bool {
        true
    }

    /// Where the family's device plugin reports its devices on a Node,
    /// which the controllers' vendor view reads into GpuNodes (HAMi's
    /// `GetNodeDevices`). NVIDIA: none (the node agent publishes its
    /// GpuNodes).
    fn sources(&self) -> Vec<Source> {
        Vec::new()
    }

    /// Whether `request` is for this family's devices (Iluvatar: of this
    /// chip), so that [`Family::admit_container`] writes it.
    fn claims_request(&self, request: &ContainerRequest) -> bool {
        request.family == self.id()
    }

    /// Writes into `container` what HAMi's webhook writes for its request
    /// `wanted` of this family (the vendor's `MutateAdmission`: limits
    /// rounded to what the plugin hands out, the vendor runtime's env).
    /// Most families write nothing.
    fn admit_container(&self, _container: &mut Container, _wanted: &ContainerRequest) {}

    /// Writes into `pod` what HAMi's webhook writes for a pod with the
    /// requests `wanted` beyond its containers' limits (annotations the
    /// plugin reads, a runtime class). Most families write nothing.
    fn admit_pod(&self, _pod: &mut Pod, _wanted: &[ContainerRequest]) {}

    /// Whether `slice` of an allocation is one of this family's (Iluvatar:
    /// of this chip), so that [`Family::hand_off`] writes it.
    fn claims(&self, slice: &DeviceSlice) -> bool {
        slice.family == self.id()
    }

    /// Writes into `out` what this family's device plugin reads at
    /// Allocate for the slices of `binding` it [claims](Family::claims)
    /// (HAMi's `PatchAnnotations`). NVIDIA writes nothing: the node agent
    /// reads the VgpuAllocation.
    fn hand_off(&self, _binding: &Binding<'_>, _out: &mut Handoff) {}
}

/// One family's quota names, and which of its requests they are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota<'a> {
    /// Only requests of this device type count against them (MetaX
    /// sGPUs, an Ascend or Iluvatar chip); `None`: every request.
    pub device_type: Option<&'a str>,
    /// The names.
    pub names: QuotaNames<'a>,
}

impl<'a> Quota<'a> {
    /// Every request of the family counts against `memory` (MiB per unit
    /// `unit`) and `cores`; an empty name: none.
    pub fn of(memory: &'a str, unit: u64, cores: &'a str) -> Self {
        let name = |n: &'a str| (!n.is_empty()).then_some(n);
        Self {
            device_type: None,
            names: QuotaNames {
                memory: name(memory).map(|m| (m, unit)),
                cores: name(cores),
            },
        }
    }

    /// The same names, for requests of `device_type` only.
    pub fn for_type(self, device_type: &'a str) -> Self {
        Self {
            device_type: Some(device_type),
            ..self
        }
    }
}

/// What the families read from one container.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The container's requests, family by family.
    pub requests: Vec<ContainerRequest>,
    /// Every rule broken.
    pub violations: Vec<Violation>,
}

impl Parsed {
    /// Takes one reader's answer.
    pub fn take(&mut self, answer: std::result::Result<Option<ContainerRequest>, Vec<Violation>>) {
        match answer {
            Ok(Some(request)) => self.requests.push(request),
            Ok(None) => {}
            Err(mut broken) => self.violations.append(&mut broken),
        }
    }
}

/// The families a configuration enables ([`RequestConfig::families`]),
/// NVIDIA first, then the vendors in the order a container's requests
/// come out (see [`ContainerRequest::family`]).
pub struct Registry<'a> {
    families: Vec<&'a dyn Family>,
}

impl RequestConfig {
    /// The families this configuration enables: NVIDIA, and each vendor
    /// whose section is present (Ascend once for all its chips, Iluvatar
    /// once per chip). The one place that reads the vendor sections.
    pub fn families(&self) -> Registry<'_> {
        let mut families: Vec<&dyn Family> = vec![self];
        if let Some(hygon) = &self.hygon {
            families.push(hygon);
        }
        if let Some(vnpus) = &self.vnpus {
            families.push(vnpus);
        }
        for chip in &self.iluvatars {
            families.push(chip);
        }
        let rest: [Option<&dyn Family>; 9] = [
            self.cambricon.as_ref().map(|c| c as &dyn Family),
            self.mthreads.as_ref().map(|c| c as &dyn Family),
            self.metax.as_ref().map(|c| c as &dyn Family),
            self.enflame.as_ref().map(|c| c as &dyn Family),
            self.kunlun.as_ref().map(|c| c as &dyn Family),
            self.amd.as_ref().map(|c| c as &dyn Family),
            self.awsneuron.as_ref().map(|c| c as &dyn Family),
            self.vastai.as_ref().map(|c| c as &dyn Family),
            self.biren.as_ref().map(|c| c as &dyn Family),
        ];
        families.extend(rest.into_iter().flatten());
        Registry { families }
    }
}

impl<'a> Registry<'a> {
    /// Every family, NVIDIA first.
    pub fn iter(&self) -> impl Iterator<Item = &'a dyn Family> + '_ {
        self.families.iter().copied()
    }

    /// HAMi's admission for `container`: what the family of each of its
    /// requests in `wanted` writes ([`Family::admit_container`]).
    pub fn admit_container(&self, container: &mut Container, wanted: &[ContainerRequest]) {
        let name = container.name.clone();
        for request in wanted.iter().filter(|r| r.name == name) {
            if let Some(family) = self.iter().find(|f| f.claims_request(request)) {
                family.admit_container(container, request);
            }
        }
    }

    /// HAMi's admission for the pod as a whole: what each family writes for
    /// the requests `wanted` ([`Family::admit_pod`]).
    pub fn admit_pod(&self, pod: &mut Pod, wanted: &[ContainerRequest]) {
        for family in self.iter() {
            family.admit_pod(pod, wanted);
        }
    }

    /// What Bind writes for `binding`: each family's keys for the slices it
    /// claims, and, when any family wrote one, the keys every vendor plugin
    /// finds its pod by (`vgpu-node`, `vgpu-time`, `bind-time`,
    /// `bind-phase: allocating`). Empty for NVIDIA GPUs only.
    pub fn hand_off(&self, binding: &Binding<'_>) -> Handoff {
        let mut out = Handoff::default();
        for family in self.iter() {
            if binding.any(|d| family.claims(d)) {
                family.hand_off(binding, &mut out);
            }
        }
        out.unclaimed = binding
            .slices()
            .filter(|d| !self.iter().any(|f| f.claims(d)))
            .map(|d| d.uuid.clone())
            .collect();
        if !out.pod.is_empty() {
            let seconds = binding.seconds();
            out.pod(VGPU_NODE, binding.spec.node_name.clone());
            out.pod(VGPU_TIME, seconds.clone());
            out.pod(BIND_TIME, seconds);
            out.pod(BIND_PHASE, "allocating");
        }
        out
    }
}
