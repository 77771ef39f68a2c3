//! Does a pod fit a node, and on which devices.

use std::collections::BTreeSet;

use crate::request::{ContainerRequest, DrsAsk, PodOptions, PodRequest, ScoringWeights};
use tessera_api::{
    mig,
    v1alpha1::{DeviceFamily, OperatingMode, SchedulingPolicy, Sharing},
};

use super::{
    node::{DeviceUsage, GpuDevice, NodeGpus, Profile},
    placement::{ContainerPlacement, EXCLUSIVE_CORES, MAX_CORE_INDEXES, MigCut, Placement, Slice},
    reason::{Cause, Census, Rejection},
    score::device_score,
    wings,
};

/// Places every GPU container of `request` on `node`, or says why it cannot.
///
/// Containers are placed in order against a working copy of the usage, so a
/// later container sees the slices of the earlier ones. Candidate devices are
/// ordered by `policy` on their device score (HAMi's: the weighted
/// fractions each would hold with the slice, [`device_score`]): binpack
/// takes the fullest first, spread the emptiest; ties go to the lower
/// index, so the answer is deterministic.
pub fn fit(
    node: &NodeGpus,
    request: &PodRequest,
    policy: SchedulingPolicy,
) -> Result<Placement, Rejection> {
    if let Some(rejection) = Rejection::nvidia_with_another_family(request) {
        return Err(rejection);
    }
    let mut usage = node.usage.clone();
    let mut containers = Vec::with_capacity(request.containers.len());
    // Moore Threads: the devices the pod's first container of the family got.
    let mut pinned: Option<Vec<usize>> = None;
    for container in &request.containers {
        let one_card = container
            .vendor
            .as_ref()
            .is_some_and(|v| v.one_card_per_pod);
        let only = pinned.as_deref().filter(|_| one_card);
        let slices = fit_container(
            &node.devices,
            &usage,
            container,
            &request.options,
            policy,
            only,
        )?;
        if one_card && pinned.is_none() {
            pinned = Some(slices.iter().map(|s| s.device).collect());
        }
        for slice in &slices {
            usage[slice.device].add(slice, node.devices[slice.device].is_exclusive(slice));
        }
        containers.push(ContainerPlacement {
            name: container.name.clone(),
            slices,
        });
    }
    Ok(Placement {
        containers,
        device_cores: node.devices.iter().map(|d| d.cores).collect(),
    })
}

/// Whether `request` fits `node`, with the same answer as [`fit`] but
/// without building a placement when that can be avoided: for one container
/// without numa-bind, `fit` succeeds exactly when enough devices pass the
/// per-device checks, so counting them is enough. Other shapes, and every
/// rejection (to explain it), go through [`fit`].
pub fn feasible(
    node: &NodeGpus,
    request: &PodRequest,
    policy: SchedulingPolicy,
) -> Result<(), Rejection> {
    if let [container] = request.containers.as_slice()
        && !request.options.numa_bind
        && !container
            .vendor
            .as_ref()
            .is_some_and(|v| v.pairs || v.by_wing || v.contiguous)
    {
        let filters =
            Filters::new(container, &request.options).busy(container, &node.devices, &node.usage);
        let wanted = container.count as usize;
        let mut passing = 0;
        for (i, (device, used)) in node.devices.iter().zip(&node.usage).enumerate() {
            if filters.same_kind(device) && check(i, device, used, container, &filters).is_ok() {
                passing += 1;
                if passing >= wanted {
                    return Ok(());
                }
            }
        }
    }
    fit(node, request, policy).map(|_| ())
}

fn fit_container(
    devices: &[GpuDevice],
    usage: &[DeviceUsage],
    container: &ContainerRequest,
    options: &PodOptions,
    policy: SchedulingPolicy,
    only: Option<&[usize]>,
) -> Result<Vec<Slice>, Rejection> {
    let filters = Filters::new(container, options).busy(container, devices, usage);
    let mut census = Census::default();
    let mut candidates: Vec<(Slice, f64)> = Vec::new();
    // Devices of the container's family and type; the others are not
    // candidates, and not counted in the reason either.
    let mut total = 0;
    let mut all_networked = true;
    for (i, (device, used)) in devices.iter().zip(usage).enumerate() {
        if !filters.same_kind(device) {
            continue;
        }
        total += 1;
        all_networked &= device.network_id.is_some();
        // HAMi's customFilterRule: every device the pod's earlier containers
        // got must be this one.
        if only.is_some_and(|pinned| !pinned.iter().all(|&d| d == i)) {
            census.note(Cause::OtherCardOfPod, device, used, container);
            continue;
        }
        match check(i, device, used, container, &filters) {
            Ok(slice) => {
                let score = device_score(device, used, &slice, filters.weights);
                candidates.push((slice, score));
            }
            Err(cause) => census.note(cause, device, used, container),
        }
    }
    candidates.sort_by(|(a, load_a), (b, load_b)| {
        let by_load = match policy {
            SchedulingPolicy::Binpack => load_b.total_cmp(load_a),
            SchedulingPolicy::Spread => load_a.total_cmp(load_b),
        };
        by_load.then(a.device.cmp(&b.device))
    });
    if container
        .vendor
        .as_ref()
        .and_then(|v| v.sharing)
        .is_some_and(Sharing::is_online)
    {
        // HAMi's prioritizeOnlineDevices: GPUs with fewer online pods first,
        // those with only offline pods last (the fewest first).
        candidates.sort_by_key(|(slice, _)| {
            let used = &usage[slice.device];
            (
                used.offline > 0 && used.online == 0,
                used.online,
                used.offline,
            )
        });
    }
    let wanted = container.count as usize;
    let fitting = candidates.len();
    let vendor = container.vendor.as_ref();
    let chosen: Vec<Slice> = if options.numa_bind && container.family.is_nvidia() {
        match pick_one_numa_node(devices, &candidates, wanted) {
            Ok(slices) => slices,
            Err(best) => return Err(Rejection::numa(container, fitting, best, total)),
        }
    } else if vendor.is_some_and(|v| v.pairs) {
        match pick_module_pairs(devices, &candidates, wanted) {
            Ok(slices) => slices,
            Err(whole) => return Err(Rejection::pairs(container, fitting, whole, total)),
        }
    } else if vendor.is_some_and(|v| v.contiguous) {
        let free = indexes_of(devices, &candidates);
        let ring = devices
            .iter()
            .any(|d| filters.same_kind(d) && (d.model.contains("inf") || d.model.contains("Inf")));
        let Some(start) = consecutive(&free, wanted, ring) else {
            return Err(Rejection::consecutive(container, &free, total, ring));
        };
        slices_at(devices, &candidates, start..start + wanted as u32)
    } else if vendor.is_some_and(|v| v.by_wing) {
        let fitting = indexes_of(devices, &candidates);
        let Some(chosen) = wings::select(&fitting, wanted) else {
            if candidates.len() < wanted {
                return Err(census.into_rejection(container, fitting.len(), total));
            }
            return Err(Rejection::wings(container, &fitting, total));
        };
        slices_at(devices, &candidates, chosen)
    } else if vendor.is_some_and(|v| v.by_network) && all_networked && wanted > 1 {
        pick_fewest_networks(devices, &candidates, wanted)
    } else if vendor.is_some_and(|v| v.by_link_zone) && candidates.len() > wanted {
        pick_smallest_link(devices, &candidates, wanted)
    } else {
        candidates
            .into_iter()
            .take(wanted)
            .map(|(s, _)| s)
            .collect()
    };
    if chosen.len() < wanted {
        return Err(census.into_rejection(container, fitting, total));
    }
    Ok(chosen)
}

/// The device indexes of the candidates, ascending (the vendors whose
/// topology is by index: Kunlunxin wings, Neuron runs).
fn indexes_of(devices: &[GpuDevice], candidates: &[(Slice, f64)]) -> Vec<u32> {
    let mut indexes: Vec<u32> = candidates
        .iter()
        .map(|(s, _)| devices[s.device].index)
        .collect();
    indexes.sort_unstable();
    indexes
}

/// The candidates' slices on the devices of these indexes, in that order.
fn slices_at(
    devices: &[GpuDevice],
    candidates: &[(Slice, f64)],
    indexes: impl IntoIterator<Item = u32>,
) -> Vec<Slice> {
    indexes
        .into_iter()
        .filter_map(|index| {
            candidates
                .iter()
                .find(|(s, _)| devices[s.device].index == index)
                .map(|(s, _)| *s)
        })
        .collect()
}

/// Ascend 910C in a SuperPod: whole modules (NPUs `2k` and `2k+1`) whose
/// two NPUs both fit, in candidate order of their first NPU; otherwise the
/// number of whole modules there are (HAMi's `computeBestCombination910C`).
fn pick_module_pairs(
    devices: &[GpuDevice],
    candidates: &[(Slice, f64)],
    wanted: usize,
) -> Result<Vec<Slice>, usize> {
    let module = |slice: &Slice| devices[slice.device].index / 2;
    let mut chosen = Vec::with_capacity(wanted);
    let mut seen = Vec::new();
    for (i, (slice, _)) in candidates.iter().enumerate() {
        let m = module(slice);
        if seen.contains(&m) {
            continue;
        }
        // The first NPU of a module met here finds its partner later on.
        let Some((partner, _)) = candidates[i + 1..].iter().find(|(o, _)| module(o) == m) else {
            continue;
        };
        seen.push(m);
        if chosen.len() < wanted {
            chosen.extend([*slice, *partner]);
        }
    }
    let whole = seen.len();
    if chosen.len() >= wanted {
        chosen.truncate(wanted);
        Ok(chosen)
    } else {
        Err(whole)
    }
}

/// Ascend 910, more than one NPU: NPUs from the network (`NetworkID`) with
/// the most fitting NPUs first, then the next, keeping candidate order
/// within a network (HAMi's `computeBestCombination`, deterministic; one
/// NPU takes the first candidate, as HAMi does).
fn pick_fewest_networks(
    devices: &[GpuDevice],
    candidates: &[(Slice, f64)],
    wanted: usize,
) -> Vec<Slice> {
    let mut groups: Vec<(Option<u32>, Vec<Slice>)> = Vec::new();
    for (slice, _) in candidates {
        let network = devices[slice.device].network_id;
        match groups.iter_mut().find(|(n, _)| *n == network) {
            Some((_, group)) => group.push(*slice),
            None => groups.push((network, vec![*slice])),
        }
    }
    groups.sort_by_key(|(_, group)| std::cmp::Reverse(group.len()));
    groups
        .into_iter()
        .flat_map(|(_, group)| group)
        .take(wanted)
        .collect()
}

/// MetaX exclusive sGPUs: the first `wanted` GPUs of the smallest MetaLink
/// (network) holding that many fitting GPUs; else the MetaLinks from the
/// smallest up, then GPUs on none (HAMi's `prioritizeExclusiveDevices`;
/// ties between MetaLinks of one size in candidate order, where HAMi's are
/// random).
fn pick_smallest_link(
    devices: &[GpuDevice],
    candidates: &[(Slice, f64)],
    wanted: usize,
) -> Vec<Slice> {
    let mut links: Vec<(u32, Vec<Slice>)> = Vec::new();
    let mut unlinked = Vec::new();
    for (slice, _) in candidates {
        match devices[slice.device].network_id {
            Some(link) => match links.iter_mut().find(|(l, _)| *l == link) {
                Some((_, group)) => group.push(*slice),
                None => links.push((link, vec![*slice])),
            },
            None => unlinked.push(*slice),
        }
    }
    links.sort_by_key(|(_, group)| group.len());
    if let Some((_, group)) = links.iter().find(|(_, g)| g.len() >= wanted) {
        return group[..wanted].to_vec();
    }
    links
        .into_iter()
        .flat_map(|(_, group)| group)
        .chain(unlinked)
        .take(wanted)
        .collect()
}

/// The first NUMA node (in candidate order) with `wanted` fitting devices;
/// otherwise the largest count any NUMA node has.
fn pick_one_numa_node(
    devices: &[GpuDevice],
    candidates: &[(Slice, f64)],
    wanted: usize,
) -> Result<Vec<Slice>, usize> {
    let mut groups: Vec<(Option<u32>, Vec<Slice>)> = Vec::new();
    for (slice, _) in candidates {
        let numa = devices[slice.device].numa_node;
        match groups.iter_mut().find(|(n, _)| *n == numa) {
            Some((_, group)) => group.push(*slice),
            None => groups.push((numa, vec![*slice])),
        }
    }
    let best = groups.iter().map(|(_, g)| g.len()).max().unwrap_or(0);
    groups
        .into_iter()
        .find(|(_, g)| g.len() >= wanted)
        .map(|(_, g)| g.into_iter().take(wanted).collect())
        .ok_or(best)
}

/// Which devices a container may use: its family and type, and the pod's
/// type and UUID filters for that family. The parse bounded the lists
/// (`crate::request::MAX_LIST_ENTRIES`) and lowercased the types, so
/// building this allocates nothing and checking a device costs at most a
/// few dozen short comparisons, whatever the pod wrote.
struct Filters<'a> {
    family: DeviceFamily,
    device_type: Option<&'a str>,
    use_types: &'a [String],
    nouse_types: &'a [String],
    use_uuids: &'a BTreeSet<String>,
    nouse_uuids: &'a BTreeSet<String>,
    /// NVIDIA: the mode `nvidia.com/vgpu-mode` asks for.
    vgpu_mode: Option<OperatingMode>,
    /// Ascend: the pod wants HAMi's soft split.
    soft_split: bool,
    /// The pod's `mutex` policy: idle devices only.
    mutex: bool,
    /// Under `mutex`, the networks of which a device holds a slice, where
    /// the family keeps them whole (Vastai's cards, [`Filters::busy`]).
    busy_networks: Vec<u32>,
    /// How the device score weighs a device's fractions.
    weights: ScoringWeights,
}

impl<'a> Filters<'a> {
    fn new(container: &'a ContainerRequest, options: &'a PodOptions) -> Self {
        match &container.vendor {
            Some(vendor) => Self {
                family: container.family,
                device_type: vendor.device_type.as_deref(),
                use_types: &vendor.filters.use_types,
                nouse_types: &vendor.filters.nouse_types,
                use_uuids: &vendor.filters.use_uuids,
                nouse_uuids: &vendor.filters.nouse_uuids,
                vgpu_mode: None,
                soft_split: vendor.soft_split,
                mutex: options.mutex.unwrap_or(false),
                busy_networks: Vec::new(),
                weights: options.scoring_weights,
            },
            None => Self {
                family: container.family,
                device_type: None,
                use_types: &options.use_gpu_types,
                nouse_types: &options.nouse_gpu_types,
                use_uuids: &options.use_gpu_uuids,
                nouse_uuids: &options.nouse_gpu_uuids,
                vgpu_mode: options.vgpu_mode,
                soft_split: false,
                mutex: options.mutex.unwrap_or(false),
                busy_networks: Vec::new(),
                weights: options.scoring_weights,
            },
        }
    }

    /// With the networks busy under the pod's `mutex` policy, where
    /// `container`'s family keeps a network (a Vastai card) whole under it:
    /// those of which a device of the container's kind holds a slice.
    fn busy(
        mut self,
        container: &ContainerRequest,
        devices: &[GpuDevice],
        usage: &[DeviceUsage],
    ) -> Self {
        let whole = container
            .vendor
            .as_ref()
            .is_some_and(|v| v.mutex_by_network);
        if self.mutex && whole {
            for (device, used) in devices.iter().zip(usage) {
                if let Some(network) = device.network_id
                    && used.slices > 0
                    && self.same_kind(device)
                    && !self.busy_networks.contains(&network)
                {
                    self.busy_networks.push(network);
                }
            }
        }
        self
    }

    /// Whether the device is of the family (and exact type) asked for.
    fn same_kind(&self, device: &GpuDevice) -> bool {
        device.family == self.family && self.device_type.is_none_or(|t| device.model == t)
    }
}

/// The slice `container` would get on device `index`, or why it cannot go
/// there, checked in the order a person would ask.
fn check(
    index: usize,
    device: &GpuDevice,
    used: &DeviceUsage,
    container: &ContainerRequest,
    filters: &Filters<'_>,
) -> Result<Slice, Cause> {
    // A slice holds at least 1 MiB, on devices that have memory to share
    // (AWS Neuron devices have none).
    let memory_mib = container.memory.resolve(device.memory_mib);
    let mut slice = Slice {
        device: index,
        memory_mib: if device.memory_mib > 0 {
            memory_mib.max(1)
        } else {
            memory_mib
        },
        cores: container.cores,
        mig: None,
        core_mask: 0,
        units: 1,
        profile: None,
        sharing: container.vendor.as_ref().and_then(|v| v.sharing),
        mutex: filters.mutex,
    };
    if !device.healthy {
        return Err(Cause::Unhealthy);
    }
    if device.cordoned {
        return Err(Cause::Cordoned);
    }
    if !filters.use_types.is_empty() || !filters.nouse_types.is_empty() {
        // The entries are lowercase already (at parse).
        let model = device.model.to_lowercase();
        if !filters.use_types.is_empty()
            && !filters.use_types.iter().any(|t| model.contains(t.as_str()))
        {
            return Err(Cause::TypeNotWanted);
        }
        if filters
            .nouse_types
            .iter()
            .any(|t| model.contains(t.as_str()))
        {
            return Err(Cause::TypeExcluded);
        }
    }
    if !filters.use_uuids.is_empty() && !filters.use_uuids.contains(&device.uuid) {
        return Err(Cause::UuidNotWanted);
    }
    if filters.nouse_uuids.contains(&device.uuid) {
        return Err(Cause::UuidExcluded);
    }
    // MetaX's co-location rules (HAMi's checkAppClass, checkDeviceQos); an
    // online pod is charged no cores and skips the core checks.
    let online = slice.sharing.is_some_and(Sharing::is_online);
    if let Some(sharing) = slice.sharing {
        if !used.takes_class(sharing.app_class) {
            return Err(Cause::AppClass);
        }
        if !online
            && container.cores < EXCLUSIVE_CORES
            && !used.takes_qos(device.qos_policy, sharing.qos_policy)
        {
            return Err(Cause::QosPolicy);
        }
        if online {
            slice.cores = 0;
        }
    }
    if filters.vgpu_mode.is_some_and(|mode| mode != device.mode) {
        return Err(Cause::ModeMismatch);
    }
    if filters.soft_split && device.mode != OperatingMode::HamiCore {
        return Err(Cause::NoSoftSplit);
    }
    if device.mode == OperatingMode::Mps && container.count > 1 {
        return Err(Cause::MpsOneGpu);
    }
    if used.exclusive > 0 {
        return Err(Cause::HeldExclusively);
    }
    // HAMi's mutex: a device with any slice is busy (a full one says so).
    if filters.mutex && used.slices > 0 && used.slices < device.split_count {
        return Err(Cause::Busy);
    }
    // Vastai's mutex: an idle die on a card another die of which is in use.
    if device
        .network_id
        .is_some_and(|n| filters.busy_networks.contains(&n))
    {
        return Err(Cause::Busy);
    }
    if let Some(layout) = &device.mig {
        if used.slices >= device.split_count {
            return Err(Cause::NoFreeSlice);
        }
        let occupied = used.mig_mask() | device.mig_present;
        let (profile, placement) =
            mig::choose(layout, slice.memory_mib, slice.cores, occupied).ok_or(Cause::MigNoRoom)?;
        let chosen = &layout.profiles[profile];
        slice.memory_mib = chosen.memory_mib;
        slice.cores = mig_cores(chosen.compute_slices, layout.compute_slices);
        slice.mig = Some(MigCut {
            profile: Some(profile),
            placement,
        });
        return Ok(slice);
    }
    if device.family.cores_are_units() {
        slice.cores = units_of(container.cores, device.cores);
    }
    // Enflame DRS: the device's profile for the ask, its memory and cores,
    // and as many of the device's slices as the profile's size.
    if let Some(ask) = container.vendor.as_ref().and_then(|v| v.drs) {
        let (i, profile) = drs_profile(&device.profiles, ask).ok_or(Cause::NoProfile)?;
        slice.memory_mib = profile.memory_mib;
        slice.cores = profile.cores;
        slice.units = profile.size;
        slice.profile = u8::try_from(i).ok();
    }
    if device.family.cores_by_index() && container.cores >= EXCLUSIVE_CORES {
        slice.cores = device.cores;
    }
    if device.is_exclusive(&slice) && used.slices > 0 {
        return Err(Cause::NotEmptyForExclusive);
    }
    if used.slices >= device.split_count {
        return Err(Cause::NoFreeSlice);
    }
    // HAMi's rule for every family: a request without cores may not share
    // a device whose cores are all handed out (it would get no compute).
    if slice.cores == 0 && !online && device.cores > 0 && used.cores >= device.cores {
        return Err(Cause::CoresExhausted);
    }
    // A sum past the integer's range does not fit either.
    if used
        .memory_mib
        .checked_add(slice.memory_mib)
        .is_none_or(|total| total > device.memory_mib)
    {
        return Err(Cause::Memory);
    }
    // Kunlunxin vXPUs: a card shares only vXPUs of one size.
    if container.vendor.as_ref().is_some_and(|v| v.same_size)
        && used.slices > 0
        && used.memory_mib / u64::from(used.slices) != slice.memory_mib
    {
        return Err(Cause::OtherSize);
    }
    if used
        .cores
        .checked_add(slice.cores)
        .is_none_or(|total| total > device.cores)
    {
        return Err(Cause::Cores);
    }
    // AWS Neuron by cores: the lowest free cores of the device, by index.
    if container.vendor.as_ref().is_some_and(|v| v.by_core_index) {
        slice.core_mask = free_cores(device, used, slice.cores).ok_or(Cause::Cores)?;
    }
    Ok(slice)
}

/// The lowest `wanted` cores of `device` no live slice holds, as a mask.
fn free_cores(device: &GpuDevice, used: &DeviceUsage, wanted: u32) -> Option<u8> {
    let held = used.core_mask();
    let mut mask = 0u8;
    let mut found = 0;
    for bit in 0..device.cores.min(MAX_CORE_INDEXES as u32) {
        if found == wanted {
            break;
        }
        if held & (1 << bit) == 0 {
            mask |= 1 << bit;
            found += 1;
        }
    }
    (found == wanted).then_some(mask)
}

/// The profile an Enflame DRS ask is cut as among `profiles` (smallest
/// first), with its position (HAMi's `selectProfileByRequest`): the one of
/// exactly the slices asked for; or the smallest with the memory (GB, read
/// as MiB when above twice the largest profile's GB) and cores asked for.
fn drs_profile(profiles: &[Profile], ask: DrsAsk) -> Option<(usize, &Profile)> {
    let mut all = profiles.iter().enumerate();
    match ask {
        DrsAsk::Slices(size) => all.find(|(_, p)| p.size == size),
        DrsAsk::Spec { memory, cores } => {
            let largest_gb = profiles.last()?.memory_mib / 1024;
            let gb = if memory > largest_gb.saturating_mul(2) {
                memory.div_ceil(1024)
            } else {
                memory
            };
            all.find(|(_, p)| p.memory_mib / 1024 >= gb && p.cores >= cores)
        }
    }
}

/// AWS Neuron (HAMi's `graphSelect`): the first index starting `wanted`
/// consecutive `free` devices; on Inferentia (a ring) any start, on
/// Trainium only starts at multiples of `wanted`, and only 4, 8 or 16
/// devices.
fn consecutive(free: &[u32], wanted: usize, ring: bool) -> Option<u32> {
    let wanted = u32::try_from(wanted).ok()?;
    let step = if ring {
        1
    } else if matches!(wanted, 1 | 4 | 8 | 16) {
        wanted
    } else {
        return None;
    };
    let last = free.last().copied()?;
    (0..=last)
        .step_by(step as usize)
        .find(|&start| (start..start + wanted).all(|i| free.contains(&i)))
}

/// AMD: `percent` of `units` compute units, rounded down, at least 1 and at
/// most all (HAMi's AMD `Fit`; a device without units gets 1, which does
/// not fit).
fn units_of(percent: u32, units: u32) -> u32 {
    let share = u64::from(percent) * u64::from(units) / 100;
    u32::try_from(share)
        .unwrap_or(u32::MAX)
        .clamp(1, units.max(1))
}

/// The percent of the SMs `compute` of `total` compute slices are, rounded
/// down (`7g` of 7 is 100: the whole GPU).
fn mig_cores(compute: u32, total: u32) -> u32 {
    let total = total.max(1);
    (compute.min(total) * EXCLUSIVE_CORES) / total
}
