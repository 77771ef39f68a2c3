//! Every way the agent touches a container's region goes through here:
//! [`read`] opens it with [`RegionFile`] (never a mapping, never a link,
//! never a special file, exactly the region's size; see
//! `tessera_vgpu_region::RegionFile`) and parses it, and every refusal is
//! remembered per container directory, warned about at most once per
//! [`WARN_EVERY`] per container, and counted for `/metrics`.
//!
//! A region that does not exist yet, is still empty, or is all zeroes (the
//! interposer creates it at the container's first CUDA call, sizes it, then
//! writes its header) is not an offence, unless the same container's region
//! was already valid once: a region never goes back to uninitialised.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessera_vgpu_region::{Error, RegionFile, Snapshot};

use crate::contract::REGION_FILE;

/// How often one container's refused region is warned about.
pub const WARN_EVERY: Duration = Duration::from_secs(600);

/// What the agent remembers of one container directory.
#[derive(Debug, Default)]
struct Record {
    /// Whether its region was read once.
    valid_once: bool,
    /// When it was last warned about.
    warned_at: Option<Instant>,
    /// Refusals since the agent started.
    refused: u64,
}

/// Per container directory (its full path).
static RECORDS: Mutex<BTreeMap<PathBuf, Record>> = Mutex::new(BTreeMap::new());

fn records() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Record>> {
    // A panic elsewhere while holding the lock leaves plain counters behind.
    RECORDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens and reads the region of container directory `dir` under `root`.
/// `None` when there is none yet, or when it is refused (recorded, and
/// warned about at most once per [`WARN_EVERY`]).
pub fn read(root: &Path, dir: &str) -> Option<(RegionFile, Snapshot)> {
    let container_dir = root.join(dir);
    let read = RegionFile::open_beneath(&container_dir, REGION_FILE)
        .and_then(|file| file.snapshot().map(|snapshot| (file, snapshot)));
    match read {
        Ok(read) => {
            records().entry(container_dir).or_default().valid_once = true;
            Some(read)
        }
        Err(error) => {
            refused(&container_dir, &error);
            None
        }
    }
}

/// Records that the region of `container_dir` failed with `error` (a read,
/// or a write of the agent's fields), warning when it is an offence and the
/// container was not warned about within [`WARN_EVERY`].
pub fn refused(container_dir: &Path, error: &Error) {
    let mut records = records();
    let pending = error.is_pending();
    if pending && !records.get(container_dir).is_some_and(|r| r.valid_once) {
        return; // no CUDA call yet
    }
    let record = records.entry(container_dir.to_owned()).or_default();
    record.refused += 1;
    let now = Instant::now();
    if record
        .warned_at
        .is_none_or(|at| now.duration_since(at) >= WARN_EVERY)
    {
        record.warned_at = Some(now);
        tracing::warn!(
            container_dir = %container_dir.display(),
            %error,
            refused = record.refused,
            "refusing a container's shared region: its usage is not reported and the agent writes \
             nothing into it until it is a valid region again (the container's processes may have \
             corrupted it; next warning for this container in 10 minutes at the earliest)"
        );
    }
}

/// Refusals per container directory name under `root` (for `/metrics`).
pub fn refusals(root: &Path) -> HashMap<String, u64> {
    records()
        .iter()
        .filter(|(dir, r)| r.refused > 0 && dir.parent() == Some(root))
        .filter_map(|(dir, r)| Some((dir.file_name()?.to_str()?.to_owned(), r.refused)))
        .collect()
}

/// Forgets a container directory that was removed.
pub fn forget(container_dir: &Path) {
    records().remove(container_dir);
}
