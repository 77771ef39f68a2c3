//! Device quotas (HAMi's, made exact): what a pod counts against its
//! namespace's ResourceQuotas, and whether that still fits.
//!
//! A namespace limits a device resource with a `limits.<name>` key in a
//! ResourceQuota (`limits.nvidia.com/gpumem: 16000`); several quotas in a
//! namespace must all hold, so the tightest counts, and an explicit 0 allows
//! none. A pod counts what it is actually given: each slice's memory in MiB
//! (percentages resolved on the device it got) and its cores, summed per
//! container, with init containers counted as the kubelet counts them:
//! `max(app containers + sidecars, each init container + the sidecars
//! started before it)`.
//!
//! An NVIDIA slice of 0 cores (no `nvidia.com/gpucores`, under the default
//! `defaultCores: 0`) runs with no compute limit (`CUDA_DEVICE_SM_LIMIT=0`),
//! so it is given the whole device's compute and counts its device's cores
//! (100 × core scaling) against a cores quota. Other families' slices count
//! their cores as they hold them: a vendor's 0 means what its plugin makes
//! of it (an Ascend vNPU template fixes its AI cores; a MetaX online sGPU
//! is charged none, as HAMi does).

use std::{collections::BTreeMap, fmt};

use crate::request::{ContainerKind, ContainerRequest, PodRequest, QuotaNames, RequestConfig};

use super::{
    node::NodeGpus,
    placement::{EXCLUSIVE_CORES, Placement, Slice},
};

/// Amounts by device resource name: memory in MiB, cores as slices hold them.
pub type Charge = BTreeMap<String, u64>;

/// The quota names each container of `request` counts against, in order:
/// what the other functions here take (worked out once per request).
pub fn names<'a>(request: &PodRequest, config: &'a RequestConfig) -> Vec<QuotaNames<'a>> {
    request
        .containers
        .iter()
        .map(|c| config.quota_names(c))
        .collect()
}

/// What `request`, placed as `placement`, counts against its namespace's
/// quotas.
pub fn charge(request: &PodRequest, placement: &Placement, names: &[QuotaNames<'_>]) -> Charge {
    let per_container = request
        .containers
        .iter()
        .zip(names)
        .zip(&placement.containers)
        .map(|((c, names), p)| {
            let mut amounts = Charge::new();
            for slice in &p.slices {
                if let Some((memory, _)) = names.memory {
                    add(&mut amounts, memory, slice.memory_mib);
                }
                if let Some(cores) = names.cores {
                    add(
                        &mut amounts,
                        cores,
                        u64::from(charged_cores(c, slice, placement)),
                    );
                }
            }
            (c.kind, amounts)
        });
    collapse(per_container)
}

/// The cores `slice` counts against a quota: what it holds, or for an
/// NVIDIA slice of none (no compute limit), its device's cores.
fn charged_cores(container: &ContainerRequest, slice: &Slice, placement: &Placement) -> u32 {
    if slice.cores == 0 && container.family.is_nvidia() {
        placement
            .device_cores
            .get(slice.device)
            .copied()
            .unwrap_or(EXCLUSIVE_CORES)
    } else {
        slice.cores
    }
}

/// The least `request` can count wherever it goes, before placement: memory
/// asked in MiB and cores asked. What depends on the device counts 0 here,
/// and Filter and Bind count it exactly on each node: a percentage of a
/// device's memory (the whole device under `defaultMemory: 0`), and an
/// NVIDIA request of 0 cores, which counts its device's cores. Neither has
/// a floor above 0 without knowing the devices: a GpuNodeConfig may scale
/// a device's memory and cores by any factor above 0.
pub fn least_charge(request: &PodRequest, names: &[QuotaNames<'_>]) -> Charge {
    let per_container = request.containers.iter().zip(names).map(|(c, names)| {
        let mut amounts = Charge::new();
        let count = u64::from(c.count);
        if let (Some((memory, _)), crate::request::MemoryRequest::Mib(mib)) =
            (names.memory, c.memory)
        {
            add(&mut amounts, memory, mib.saturating_mul(count));
        }
        if let Some(cores) = names.cores {
            add(
                &mut amounts,
                cores,
                u64::from(c.cores).saturating_mul(count),
            );
        }
        (c.kind, amounts)
    });
    collapse(per_container)
}

/// The most `request` can count on `node`: every slice as large as the
/// node's largest device of the container's family (a slice never holds
/// more memory or cores than its device has). When this fits, so does the
/// exact [`charge`], and the pod need not be placed to know it.
pub fn most_charge(request: &PodRequest, node: &NodeGpus, names: &[QuotaNames<'_>]) -> Charge {
    let per_container = request.containers.iter().zip(names).map(|(c, names)| {
        let (memory, cores) = node
            .devices
            .iter()
            .filter(|d| d.family == c.family)
            .fold((0, 0), |(m, k), d| (m.max(d.memory_mib), k.max(d.cores)));
        let count = u64::from(c.count);
        let mut amounts = Charge::new();
        if let Some((name, _)) = names.memory {
            add(&mut amounts, name, memory.saturating_mul(count));
        }
        if let Some(name) = names.cores {
            add(&mut amounts, name, u64::from(cores).saturating_mul(count));
        }
        (c.kind, amounts)
    });
    collapse(per_container)
}

fn add(amounts: &mut Charge, name: &str, amount: u64) {
    let total = amounts.entry(name.to_owned()).or_default();
    *total = total.saturating_add(amount);
}

/// The kubelet's effective request over containers in start order.
fn collapse(containers: impl Iterator<Item = (ContainerKind, Charge)>) -> Charge {
    let mut running = Charge::new();
    let mut sidecars = Charge::new();
    let mut peak = Charge::new();
    for (kind, amounts) in containers {
        match kind {
            ContainerKind::Init => {
                for (name, amount) in amounts {
                    let during = amount.saturating_add(sidecars.get(&name).copied().unwrap_or(0));
                    let highest = peak.entry(name).or_default();
                    *highest = (*highest).max(during);
                }
            }
            ContainerKind::Sidecar => {
                for (name, amount) in amounts {
                    add(&mut sidecars, &name, amount);
                    add(&mut running, &name, amount);
                }
            }
            ContainerKind::App => {
                for (name, amount) in amounts {
                    add(&mut running, &name, amount);
                }
            }
        }
    }
    for (name, amount) in peak {
        let total = running.entry(name).or_default();
        *total = (*total).max(amount);
    }
    running.retain(|_, amount| *amount > 0);
    running
}

/// One device resource's limit in a namespace: the tightest of its quotas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The ResourceQuota that sets it.
    pub quota: String,
    /// The limit, in the resource's unit.
    pub hard: u64,
    /// MiB per unit (memory resources); 1 for cores.
    pub unit: u64,
}

impl Limit {
    /// The limit in the charge's unit (MiB for memory).
    pub fn in_charge_units(&self) -> u64 {
        self.hard.saturating_mul(self.unit)
    }
}

/// A namespace's device limits by resource name.
pub type Limits = BTreeMap<String, Limit>;

/// Why a pod does not fit its namespace's quota: the first resource over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverQuota {
    /// The resource name (`nvidia.com/gpumem`).
    pub resource: String,
    /// Its limit.
    pub limit: Limit,
    /// What the namespace's pods hold, in the charge's unit.
    pub used: u64,
    /// What the pod asks, in the charge's unit.
    pub asked: u64,
}

impl fmt::Display for OverQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            resource,
            limit,
            used,
            asked,
        } = self;
        let unit = if limit.unit > 1 {
            format!(" ({} MiB each)", limit.unit)
        } else {
            String::new()
        };
        write!(
            f,
            "ResourceQuota {:?} allows limits.{resource}: {}{unit}; the namespace's pods hold {}, this pod would add {}",
            limit.quota,
            limit.hard,
            in_units(*used, limit.unit),
            in_units(*asked, limit.unit),
        )
    }
}

/// `amount` (a charge: MiB for memory) in units of `unit`, rounded up: how
/// quotas show what is held.
pub fn in_units(amount: u64, unit: u64) -> u64 {
    amount.div_ceil(unit.max(1))
}

/// Whether `asked` fits beside `used` under `limits`; the first resource
/// (by name) it would take past its limit otherwise.
pub fn check(limits: &Limits, used: &Charge, asked: &Charge) -> Result<(), OverQuota> {
    for (resource, &amount) in asked {
        let Some(limit) = limits.get(resource) else {
            continue;
        };
        let held = used.get(resource).copied().unwrap_or(0);
        if held.saturating_add(amount) > limit.in_charge_units() {
            return Err(OverQuota {
                resource: resource.clone(),
                limit: limit.clone(),
                used: held,
                asked: amount,
            });
        }
    }
    Ok(())
}

/// Adds (or with `sign` false removes) `charge` to a running total.
pub fn accumulate(total: &mut Charge, charge: &Charge, sign: bool) {
    for (name, &amount) in charge {
        let held = total.entry(name.clone()).or_default();
        *held = if sign {
            held.saturating_add(amount)
        } else {
            held.saturating_sub(amount)
        };
    }
    total.retain(|_, amount| *amount > 0);
}
