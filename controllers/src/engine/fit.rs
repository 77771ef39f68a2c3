//! Does a pod fit a node, and on which devices.

use tessera_api::{
    mig,
    request::{ContainerRequest, PodOptions, PodRequest},
    v1alpha1::{OperatingMode, SchedulingPolicy},
};

use super::{
    ContainerPlacement, DeviceUsage, EXCLUSIVE_CORES, GpuDevice, MigCut, NodeGpus, Placement,
    Rejection, Slice,
    reason::{Cause, Census},
    score::device_load,
};

/// Places every GPU container of `request` on `node`, or says why it cannot.
///
/// Containers are placed in order against a working copy of the usage, so a
/// later container sees the slices of the earlier ones. Candidate devices are
/// ordered by `policy`: binpack takes the fullest first, spread the emptiest;
/// ties go to the lower index, so the answer is deterministic.
pub fn fit(
    node: &NodeGpus,
    request: &PodRequest,
    policy: SchedulingPolicy,
) -> Result<Placement, Rejection> {
    let mut usage = node.usage.clone();
    let mut containers = Vec::with_capacity(request.containers.len());
    for container in &request.containers {
        let slices = fit_container(&node.devices, &usage, container, &request.options, policy)?;
        for slice in &slices {
            usage[slice.device].add(slice);
        }
        containers.push(ContainerPlacement {
            name: container.name.clone(),
            slices,
        });
    }
    Ok(Placement { containers })
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
    {
        let filters = Filters::new(&request.options);
        let wanted = container.count as usize;
        let mut passing = 0;
        for (i, (device, used)) in node.devices.iter().zip(&node.usage).enumerate() {
            if check(i, device, used, container, &filters, &request.options).is_ok() {
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
) -> Result<Vec<Slice>, Rejection> {
    let filters = Filters::new(options);
    let mut census = Census::default();
    let mut candidates: Vec<(Slice, f64)> = Vec::new();
    for (i, (device, used)) in devices.iter().zip(usage).enumerate() {
        match check(i, device, used, container, &filters, options) {
            Ok(slice) => candidates.push((slice, device_load(device, used))),
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
    let wanted = container.count as usize;
    let fitting = candidates.len();
    let chosen: Vec<Slice> = if options.numa_bind {
        match pick_one_numa_node(devices, &candidates, wanted) {
            Ok(slices) => slices,
            Err(best) => return Err(Rejection::numa(container, fitting, best, devices.len())),
        }
    } else {
        candidates
            .into_iter()
            .take(wanted)
            .map(|(s, _)| s)
            .collect()
    };
    if chosen.len() < wanted {
        return Err(census.into_rejection(container, fitting, devices.len()));
    }
    Ok(chosen)
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

/// Type filters lowered once per container.
struct Filters {
    use_types: Vec<String>,
    nouse_types: Vec<String>,
}

impl Filters {
    fn new(options: &PodOptions) -> Self {
        let lower = |v: &[String]| v.iter().map(|t| t.to_lowercase()).collect();
        Self {
            use_types: lower(&options.use_gpu_types),
            nouse_types: lower(&options.nouse_gpu_types),
        }
    }
}

/// The slice `container` would get on device `index`, or why it cannot go
/// there, checked in the order a person would ask.
fn check(
    index: usize,
    device: &GpuDevice,
    used: &DeviceUsage,
    container: &ContainerRequest,
    filters: &Filters,
    options: &PodOptions,
) -> Result<Slice, Cause> {
    let mut slice = Slice {
        device: index,
        memory_mib: container.memory.resolve(device.memory_mib).max(1),
        cores: container.cores,
        mig: None,
    };
    if !device.healthy {
        return Err(Cause::Unhealthy);
    }
    if !filters.use_types.is_empty() || !filters.nouse_types.is_empty() {
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
    if !options.use_gpu_uuids.is_empty() && !options.use_gpu_uuids.contains(&device.uuid) {
        return Err(Cause::UuidNotWanted);
    }
    if options.nouse_gpu_uuids.contains(&device.uuid) {
        return Err(Cause::UuidExcluded);
    }
    if options.vgpu_mode.is_some_and(|mode| mode != device.mode) {
        return Err(Cause::ModeMismatch);
    }
    if device.mode == OperatingMode::Mps && container.count > 1 {
        return Err(Cause::MpsOneGpu);
    }
    if used.exclusive > 0 {
        return Err(Cause::HeldExclusively);
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
    if slice.cores >= EXCLUSIVE_CORES && used.slices > 0 {
        return Err(Cause::NotEmptyForExclusive);
    }
    if used.slices >= device.split_count {
        return Err(Cause::NoFreeSlice);
    }
    // A sum past the integer's range does not fit either.
    if used
        .memory_mib
        .checked_add(slice.memory_mib)
        .is_none_or(|total| total > device.memory_mib)
    {
        return Err(Cause::Memory);
    }
    if used
        .cores
        .checked_add(slice.cores)
        .is_none_or(|total| total > device.cores)
    {
        return Err(Cause::Cores);
    }
    Ok(slice)
}

/// The percent of the SMs `compute` of `total` compute slices are, rounded
/// down (`7g` of 7 is 100: the whole GPU).
fn mig_cores(compute: u32, total: u32) -> u32 {
    let total = total.max(1);
    (compute.min(total) * EXCLUSIVE_CORES) / total
}
