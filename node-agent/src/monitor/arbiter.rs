//! What the agent writes into the containers' shared regions besides the
//! sharing marks: the holds that carry out `CUDA_TASK_PRIORITY` across
//! containers, and each process's host pid.
//!
//! Priority (HAMi's meaning): while a high-priority container (0) launches
//! on a GPU, the low-priority containers (1, the default) with a compute
//! limit on that GPU are held back. Only the agent sees every container of a
//! GPU, so it decides ([`tessera_vgpu_region::priority::arbitrate`]) every
//! [`ARBITRATE_EVERY`]; a hold lapses by itself if the agent stops renewing it.
//!
//! Host pids: a process in a container with its own pid namespace records
//! its namespace's pid; NVML speaks of host pids. The agent finds each slot's
//! process in `/proc` by its namespace pid and start time and writes the host
//! pid, which the interposer uses to filter NVML's process lists and to
//! charge each process its own GPU time.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tessera_api::v1alpha1::VgpuAllocation;
use tessera_vgpu_region::{
    Priority, SlotId,
    priority::{self, Contender},
    process_start_time,
};

use super::regions;
use crate::{
    contract::{CONTAINER_REGION_DIR, REGION_FILE},
    holders::live_allocations,
};

/// How often holds are decided (a hold lasts [`priority::HOLD_NS`]).
pub const ARBITRATE_EVERY: Duration = Duration::from_millis(200);
/// Host pids are looked up every this many arbitration rounds.
const HOST_PID_ROUNDS: u32 = 10;

/// What the arbiter knows of a live GPU container, from its allocation
/// (never from its region, which the container can write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// `nvidia.com/priority` as the allocation granted it.
    pub priority: Priority,
    /// The GPU UUID behind each CUDA ordinal.
    pub gpus: Vec<Option<String>>,
}

/// Every live GPU container, by region directory name
/// (`<pod-uid>_<container>`).
pub fn container_gpus(allocations: &[VgpuAllocation]) -> BTreeMap<String, Container> {
    live_allocations(allocations)
        .flat_map(|a| {
            a.spec.containers.iter().map(|c| {
                (
                    a.region_name(&c.name),
                    Container {
                        priority: if c.priority == Some(0) {
                            Priority::High
                        } else {
                            Priority::Low
                        },
                        gpus: c.devices.iter().map(|d| Some(d.uuid.clone())).collect(),
                    },
                )
            })
        })
        .collect()
}

/// One arbitration round over the regions under `root`; returns how many
/// containers are held. Containers without a valid region (no CUDA call yet,
/// or refused) are skipped. Priorities and GPUs are the allocations'; from
/// a region only its launch times are read (a container claiming launches
/// can only hold others if its allocation made it high priority, and then
/// its real launches would hold them too).
pub fn arbitrate_once(root: &Path, containers: &BTreeMap<String, Container>) -> usize {
    let now = priority::monotonic_now();
    let read: Vec<(&String, &Container, _)> = containers
        .iter()
        .filter_map(|(dir, c)| regions::read(root, dir).map(|r| (dir, c, r)))
        .collect();
    let contenders: Vec<Contender<'_, String>> = read
        .iter()
        .map(|(_, c, (_, snapshot))| Contender {
            priority: c.priority,
            launches: snapshot,
            gpus: &c.gpus,
        })
        .collect();
    let decided = priority::holds(&contenders, now, priority::ACTIVE_WINDOW_NS);
    let mut held = 0;
    for ((dir, _, (file, snapshot)), devices) in read.iter().zip(decided) {
        if devices == 0 && snapshot.hold.is_none() {
            continue; // nothing to hold, nothing to release
        }
        if let Err(error) = file.set_hold(devices, now + priority::HOLD_NS) {
            regions::refused(&root.join(dir), &error);
            continue;
        }
        held += usize::from(devices != 0);
    }
    held
}

/// Candidate host pids by (innermost namespace pid, start time), from
/// `/proc/*/status` `NSpid` lines. Several containers can hold the same key
/// (each one's first process is pid 1, and start times tick every 10 ms).
pub fn host_pids(proc_root: &Path) -> HashMap<(u32, u64), Vec<u32>> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return HashMap::new();
    };
    let mut found: HashMap<(u32, u64), Vec<u32>> = HashMap::new();
    for entry in entries.flatten() {
        let Some(host) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|pids| pids.split_whitespace().last())
            .and_then(|pid| pid.parse::<u32>().ok());
        if let (Some(inner), Some(start)) = (inner, process_start_time(host)) {
            found.entry((inner, start)).or_default().push(host);
        }
    }
    found
}

/// Identifies a file: (device, inode). The last component is not followed
/// (the region a process sees is a regular file, never a link); nothing is
/// opened.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Which candidate is the slot's process: the one that sees this very
/// region file at the container's region path; or, in the agent's own pid
/// namespace (no container), the pid itself.
fn pick(
    candidates: &[u32],
    inner: u32,
    region: Option<(u64, u64)>,
    proc_root: &Path,
) -> Option<u32> {
    let inside = Path::new(CONTAINER_REGION_DIR.trim_start_matches('/')).join(REGION_FILE);
    let sees_region = |host: &u32| {
        region.is_some()
            && file_id(&proc_root.join(host.to_string()).join("root").join(&inside)) == region
    };
    let mut matching = candidates.iter().copied().filter(sees_region);
    match (matching.next(), matching.next()) {
        (Some(host), None) => Some(host),
        (Some(_), Some(_)) => None,
        (None, _) => candidates.iter().copied().find(|&host| host == inner),
    }
}

/// Writes the host pid of every slot under `root` that lacks one; returns
/// how many were written.
pub fn fill_host_pids(
    root: &Path,
    dirs: impl IntoIterator<Item = String>,
    pids: &HashMap<(u32, u64), Vec<u32>>,
    proc_root: &Path,
) -> usize {
    let mut written = 0;
    for dir in dirs {
        let Some((region, snapshot)) = regions::read(root, &dir) else {
            continue;
        };
        let region_id = Some(region.id());
        for process in snapshot.processes {
            if process.host_pid.is_some() {
                continue;
            }
            let Some(candidates) = pids.get(&(process.pid, process.start_time)) else {
                continue;
            };
            let (Some(host), Some(slot)) = (
                pick(candidates, process.pid, region_id, proc_root),
                SlotId::from_index(process.slot),
            ) else {
                continue;
            };
            // The slot may have changed hands since the snapshot.
            let still = region.snapshot().is_ok_and(|now| {
                now.processes.iter().any(|p| {
                    p.slot == process.slot
                        && p.pid == process.pid
                        && p.start_time == process.start_time
                })
            });
            if !still {
                continue;
            }
            match region.set_host_pid(slot, host) {
                Ok(()) => written += 1,
                Err(error) => {
                    regions::refused(&root.join(&dir), &error);
                    break;
                }
            }
        }
    }
    written
}

/// Whether a live allocation gave a container high priority.
fn any_high_priority(allocations: &[VgpuAllocation]) -> bool {
    live_allocations(allocations)
        .flat_map(|a| &a.spec.containers)
        .any(|c| c.priority == Some(0))
}

/// Whether any region slot still lacks its host pid (only then is `/proc`
/// scanned).
fn missing_host_pids<'a>(root: &Path, dirs: impl IntoIterator<Item = &'a String>) -> bool {
    dirs.into_iter().any(|dir| {
        regions::read(root, dir)
            .is_some_and(|(_, snapshot)| snapshot.processes.iter().any(|p| p.host_pid.is_none()))
    })
}

/// Decides holds every [`ARBITRATE_EVERY`] and fills host pids every
/// `HOST_PID_ROUNDS` rounds, for the containers of the node's live
/// allocations.
pub async fn run(view: crate::view::NodeView, regions: PathBuf) {
    let mut ticks = tokio::time::interval(ARBITRATE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round = 0u32;
    loop {
        ticks.tick().await;
        view.ready().await;
        let allocations = view.allocations();
        let containers = container_gpus(&allocations);
        // Holds are needed only while a container was granted high priority
        // (`nvidia.com/priority: 0`); those set earlier lapse by themselves.
        let arbitrate = any_high_priority(&allocations);
        let root = regions.clone();
        let fill = round.is_multiple_of(HOST_PID_ROUNDS);
        round = round.wrapping_add(1);
        let _ = tokio::task::spawn_blocking(move || {
            if arbitrate {
                let held = arbitrate_once(&root, &containers);
                if held > 0 {
                    tracing::debug!(held, "low-priority containers held back");
                }
            }
            if fill && missing_host_pids(&root, containers.keys()) {
                let proc_root = Path::new("/proc");
                let pids = host_pids(proc_root);
                fill_host_pids(&root, containers.into_keys(), &pids, proc_root);
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_vgpu_region::{Limits, MAX_DEVICES, Priority, Region};

    fn region(root: &Path, dir: &str, priority: Priority, sm: u8) -> Region {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        let mut limits = Limits {
            memory: [0; MAX_DEVICES],
            sm_percent: [0; MAX_DEVICES],
            priority,
        };
        limits.sm_percent[0] = sm;
        Region::create_or_open_with(&root.join(dir).join(REGION_FILE), &limits)
            .unwrap()
            .0
    }

    fn gpus(uuid: &str) -> Container {
        Container {
            priority: Priority::Low,
            gpus: vec![Some(uuid.to_owned())],
        }
    }

    fn high_priority(uuid: &str) -> Container {
        Container {
            priority: Priority::High,
            ..gpus(uuid)
        }
    }

    #[test]
    fn a_busy_high_priority_container_holds_low_ones_on_its_gpu_only() {
        let root = tempfile::tempdir().unwrap();
        let high = region(root.path(), "p1_high", Priority::High, 30);
        let low = region(root.path(), "p2_low", Priority::Low, 50);
        let elsewhere = region(root.path(), "p3_other", Priority::Low, 50);
        let me = process_start_time(std::process::id()).unwrap();
        let slot = high.claim_slot(std::process::id(), me).unwrap();
        let containers = BTreeMap::from([
            ("p1_high".to_owned(), high_priority("GPU-a")),
            ("p2_low".to_owned(), gpus("GPU-a")),
            ("p3_other".to_owned(), gpus("GPU-b")),
            ("p4_no_region_yet".to_owned(), gpus("GPU-a")),
            // Its region claims high priority; its allocation says low.
            ("p5_liar".to_owned(), gpus("GPU-b")),
        ]);
        let liar = region(root.path(), "p5_liar", Priority::High, 50);
        let liar_slot = liar.claim_slot(std::process::id(), me).unwrap();
        liar.record_launch(liar_slot, 0, priority::monotonic_now());

        assert_eq!(
            arbitrate_once(root.path(), &containers),
            0,
            "nobody launched"
        );
        high.record_launch(slot, 0, priority::monotonic_now());
        assert_eq!(arbitrate_once(root.path(), &containers), 1);
        let now = priority::monotonic_now();
        assert!(low.held(0, now), "same GPU: held");
        assert!(
            !elsewhere.held(0, now),
            "another GPU: free, whatever the liar's region claims"
        );
        assert!(!high.held(0, now));
        assert!(!liar.held(0, now), "nobody high on GPU-b");
    }

    #[test]
    fn slots_get_the_host_pid_of_their_process() {
        let root = tempfile::tempdir().unwrap();
        let region = region(root.path(), "p1_main", Priority::Low, 0);
        let me = std::process::id();
        let slot = region
            .claim_slot(me, process_start_time(me).unwrap())
            .unwrap();
        let proc_root = Path::new("/proc");
        let pids = host_pids(proc_root);
        let dirs = ["p1_main".to_owned()];
        assert!(missing_host_pids(root.path(), &dirs));
        assert_eq!(
            fill_host_pids(root.path(), ["p1_main".to_owned()], &pids, proc_root),
            1
        );
        assert!(!missing_host_pids(root.path(), &dirs));
        assert_eq!(region.host_pid(slot), Some(me));
        assert_eq!(
            fill_host_pids(root.path(), ["p1_main".to_owned()], &pids, proc_root),
            0,
            "written once"
        );
    }

    #[test]
    fn a_pid_shared_by_containers_goes_to_the_one_that_sees_the_region() {
        let dir = tempfile::tempdir().unwrap();
        let region = dir.path().join("region");
        std::fs::write(&region, b"r").unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, b"o").unwrap();
        let proc_root = dir.path().join("proc");
        // Two containers' pid 1 (host pids 4001 and 4002), each seeing its own region.
        // `/proc/<pid>/root` is a link to the container's root, in which the
        // region is a regular file (a hard link stands for the bind mount).
        for (host, target) in [(4001, &other), (4002, &region)] {
            let container = dir.path().join(format!("container-{host}"));
            let inside = container.join("var/run/tessera/vgpu");
            std::fs::create_dir_all(&inside).unwrap();
            std::fs::hard_link(target, inside.join("region")).unwrap();
            std::fs::create_dir_all(proc_root.join(host.to_string())).unwrap();
            std::os::unix::fs::symlink(&container, proc_root.join(format!("{host}/root"))).unwrap();
        }
        let id = file_id(&region);
        assert_eq!(pick(&[4001, 4002], 1, id, &proc_root), Some(4002));
        assert_eq!(pick(&[4001], 1, id, &proc_root), None, "never a guess");
        assert_eq!(
            pick(&[7, 4001], 7, id, &proc_root),
            Some(7),
            "same pid namespace"
        );
    }

    #[test]
    fn container_gpus_follow_device_order_and_skip_released_allocations() {
        use tessera_api::{testing, v1alpha1::*};
        let allocation = |uid: &str, phase: Option<AllocationPhase>| {
            let mut main = testing::container(
                "main",
                ["GPU-1", "GPU-0"]
                    .iter()
                    .map(|u| DeviceSlice {
                        family: Default::default(),
                        template: None,
                        uuid: (*u).into(),
                        memory_mib: 1,
                        ..Default::default()
                    })
                    .collect(),
            );
            main.priority = Some(0);
            testing::allocation(uid, uid, "n")
                .policies(SchedulingPolicy::Binpack, SchedulingPolicy::Binpack)
                .container(main)
                .maybe_phase(phase)
                .build()
        };
        let live = allocation("u1", Some(AllocationPhase::Allocated));
        let released = allocation("u2", Some(AllocationPhase::Released));
        assert!(any_high_priority(std::slice::from_ref(&live)));
        assert!(!any_high_priority(std::slice::from_ref(&released)));
        let gpus = container_gpus(&[live, released]);
        assert_eq!(
            gpus,
            BTreeMap::from([(
                "u1_main".to_owned(),
                Container {
                    priority: Priority::High,
                    gpus: vec![Some("GPU-1".to_owned()), Some("GPU-0".to_owned())]
                }
            )])
        );
    }
}
