//! The containers this agent answered, kept in a small file in its state
//! directory (`served.json`) so that a restarted agent knows them.
//!
//! The kubelet's Allocate names no container: the agent serves the first
//! container of the lock holder's allocation that is not yet served. The
//! allocation's `servedContainers` is written after the kubelet has its
//! answer, so an agent killed in between would serve the same container
//! again to the pod's next one. Each answered container is therefore written
//! here, durably (a temporary file synced and renamed over this one, then
//! the directory synced), before the kubelet gets the answer, and read back
//! when the agent starts.
//!
//! The file is parsed strictly and bounded ([`MAX_BYTES`], [`MAX_PODS`],
//! [`MAX_CONTAINERS`]); neither it nor its temporary file is ever opened
//! through a symlink. A file that is there but cannot be used makes the
//! record [`Served::uncertain`]: the agent then refuses to guess for a pod
//! it cannot account for (see `plugin::service`).

use std::{
    fs::{File, OpenOptions},
    io::{Read, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tessera_api::v1alpha1::{AllocationPhase, NodeLock, VgpuAllocation};

use crate::{Error, error::AllocateError};

/// The file's name in the agent's state directory.
pub const FILE_NAME: &str = "served.json";
/// The largest file read back, in bytes.
pub const MAX_BYTES: u64 = 64 * 1024;
/// The most pods kept; the oldest goes first. Only the lock holder is ever
/// served and its entry goes once its last container is recorded, so more
/// than one or two means status writes failed.
pub const MAX_PODS: usize = 32;
/// The most containers kept per pod.
pub const MAX_CONTAINERS: usize = 64;
/// The longest pod UID or container name kept.
const MAX_NAME: usize = 253;
/// The file's format version.
const VERSION: u32 = 1;

/// The file's contents.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Contents {
    version: u32,
    pods: Vec<Pod>,
}

/// One pod's answered containers.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Pod {
    uid: String,
    containers: Vec<String>,
}

/// What the agent found when it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// No file: a first start.
    Nothing,
    /// The file, read and valid.
    Read,
    /// A file that cannot be used (why): containers answered before the
    /// start are unknown.
    Unusable(String),
}

/// The containers answered, by pod UID, in memory and in the file.
#[derive(Clone, Debug)]
pub struct Served {
    /// The file.
    path: PathBuf,
    pods: Arc<Mutex<Vec<Pod>>>,
    /// When the agent started, if the file it found could not be used.
    uncertain: Option<(Timestamp, String)>,
}

impl Served {
    /// The record in `state_dir`, read back from its file; with what was
    /// found there. The directory is created when missing.
    pub fn open(state_dir: &Path) -> Result<(Self, Found), Error> {
        std::fs::create_dir_all(state_dir)
            .map_err(Error::io(format!("creating {}", state_dir.display())))?;
        let path = state_dir.join(FILE_NAME);
        let (pods, found) = match read(&path) {
            Ok(None) => (Vec::new(), Found::Nothing),
            Ok(Some(text)) => match parse(&text) {
                Ok(pods) => (pods, Found::Read),
                Err(why) => (Vec::new(), Found::Unusable(why)),
            },
            Err(error) => (Vec::new(), Found::Unusable(error.to_string())),
        };
        let uncertain = match &found {
            Found::Unusable(why) => Some((crate::whole_seconds_now(), why.clone())),
            _ => None,
        };
        let served = Self {
            path,
            pods: Arc::new(Mutex::new(pods)),
            uncertain,
        };
        Ok((served, found))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// When the agent started and why, if the file it found could not be
    /// used: who was answered before then is unknown.
    pub fn uncertain(&self) -> Option<&(Timestamp, String)> {
        self.uncertain.as_ref()
    }

    /// The containers answered for the pod `uid`.
    pub fn of(&self, uid: &str) -> Vec<String> {
        self.lock()
            .iter()
            .find(|p| p.uid == uid)
            .map(|p| p.containers.clone())
            .unwrap_or_default()
    }

    /// Adds `container` of the pod `uid` and writes the file durably before
    /// returning. On failure nothing changes, in memory or on disk.
    pub fn add(&self, uid: &str, container: &str) -> Result<(), Error> {
        if uid.len() > MAX_NAME || container.len() > MAX_NAME {
            return Err(Error::Serving(format!(
                "pod UID {uid:?} or container {container:?} is longer than {MAX_NAME} bytes"
            )));
        }
        let mut pods = self.lock();
        let mut next = pods.clone();
        match next.iter_mut().find(|p| p.uid == uid) {
            Some(pod) if pod.containers.iter().any(|c| c == container) => return Ok(()),
            Some(pod) if pod.containers.len() >= MAX_CONTAINERS => {
                return Err(Error::Serving(format!(
                    "pod UID {uid} has more than {MAX_CONTAINERS} containers answered"
                )));
            }
            Some(pod) => pod.containers.push(container.to_owned()),
            None => {
                if next.len() >= MAX_PODS {
                    let dropped = next.remove(0);
                    tracing::warn!(pod_uid = %dropped.uid, kept = MAX_PODS, "forgetting the oldest pod's answered containers");
                }
                next.push(Pod {
                    uid: uid.to_owned(),
                    containers: vec![container.to_owned()],
                });
            }
        }
        // Bounded on disk too: the oldest other pods go until it fits.
        let text = loop {
            let text = encode(&next)?;
            if text.len() as u64 <= MAX_BYTES {
                break text;
            }
            let Some(oldest) = next.iter().position(|p| p.uid != uid) else {
                return Err(Error::Serving(format!(
                    "the answered containers of pod UID {uid} take more than {MAX_BYTES} bytes"
                )));
            };
            let dropped = next.remove(oldest);
            tracing::warn!(pod_uid = %dropped.uid, max_bytes = MAX_BYTES, "forgetting the oldest pod's answered containers");
        };
        self.write(&text)?;
        *pods = next;
        Ok(())
    }

    /// Forgets the pod `uid` (its containers are recorded in its
    /// allocation); a failed write only leaves the entry in the file.
    pub fn forget(&self, uid: &str) {
        let mut pods = self.lock();
        if !pods.iter().any(|p| p.uid == uid) {
            return;
        }
        pods.retain(|p| p.uid != uid);
        if let Err(error) = encode(&pods).and_then(|text| self.write(&text)) {
            tracing::warn!(%error, pod_uid = %uid, "could not forget a served pod's containers on disk");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Pod>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self, text: &[u8]) -> Result<(), Error> {
        let path = &self.path;
        replace(path, text).map_err(Error::io(format!("writing {}", path.display())))
    }
}

/// The file's text for `pods`.
fn encode(pods: &[Pod]) -> Result<Vec<u8>, Error> {
    let contents = Contents {
        version: VERSION,
        pods: pods.to_vec(),
    };
    serde_json::to_vec(&contents)
        .map_err(|e| Error::Serving(format!("encoding the served containers: {e}")))
}

/// Refuses to guess which container the kubelet asks for when the agent's
/// record of answered containers was unusable at its start (`uncertain`:
/// when it started, and why) and the holder may have been answered by the
/// agent before: its lock was taken no later than the start, this agent
/// answered none of its containers (`answered_here`), it is still `Bound`,
/// and two or more of its containers wait for devices (with one, there is
/// nothing to confuse).
pub fn known(
    lock: &NodeLock,
    allocation: &VgpuAllocation,
    answered_here: bool,
    uncertain: Option<&(Timestamp, String)>,
) -> Result<(), AllocateError> {
    let Some((started, why)) = uncertain else {
        return Ok(());
    };
    let status = allocation.status.as_ref();
    let bound = status
        .and_then(|s| s.phase)
        .is_none_or(|p| p == AllocationPhase::Bound);
    if answered_here || !bound || lock.spec.acquired_at.0 > *started {
        return Ok(());
    }
    let served = status.map_or(&[][..], |s| s.served_containers.as_slice());
    let waiting = allocation
        .spec
        .containers
        .iter()
        .filter(|c| !c.devices.is_empty() && !served.contains(&c.name))
        .count();
    if waiting < 2 {
        return Ok(());
    }
    let h = &lock.spec.holder;
    Err(AllocateError::ServedUnknown {
        holder: format!("{}/{} (UID {})", h.namespace, h.name, h.uid),
        waiting,
        why: why.clone(),
    })
}

/// The file's text, `None` when there is none; never through a symlink,
/// only a regular file of at most [`MAX_BYTES`].
fn read(path: &Path) -> std::io::Result<Option<String>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.len() > MAX_BYTES {
        return Err(std::io::Error::other(format!(
            "{} bytes, more than {MAX_BYTES}",
            meta.len()
        )));
    }
    let mut text = String::new();
    file.take(MAX_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_BYTES {
        return Err(std::io::Error::other(format!(
            "more than {MAX_BYTES} bytes"
        )));
    }
    Ok(Some(text))
}

/// The pods in `text`, or why it is not a valid file.
fn parse(text: &str) -> Result<Vec<Pod>, String> {
    let contents: Contents = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if contents.version != VERSION {
        return Err(format!("version {}, expected {VERSION}", contents.version));
    }
    if contents.pods.len() > MAX_PODS {
        return Err(format!("{} pods, at most {MAX_PODS}", contents.pods.len()));
    }
    let valid = |name: &str| {
        !name.is_empty() && name.len() <= MAX_NAME && !name.chars().any(char::is_control)
    };
    for (i, pod) in contents.pods.iter().enumerate() {
        if !valid(&pod.uid) {
            return Err(format!("pod {i}: invalid UID {:?}", pod.uid));
        }
        if contents.pods[..i].iter().any(|p| p.uid == pod.uid) {
            return Err(format!("pod UID {} listed twice", pod.uid));
        }
        if pod.containers.is_empty() || pod.containers.len() > MAX_CONTAINERS {
            return Err(format!(
                "pod UID {}: {} containers, from 1 to {MAX_CONTAINERS}",
                pod.uid,
                pod.containers.len()
            ));
        }
        for (j, container) in pod.containers.iter().enumerate() {
            if !valid(container) || pod.containers[..j].contains(container) {
                return Err(format!(
                    "pod UID {}: invalid or repeated container {container:?}",
                    pod.uid
                ));
            }
        }
    }
    Ok(contents.pods)
}

/// Replaces `path` with `contents`: a temporary file beside it (never
/// through a symlink), synced, renamed over it, the directory synced.
fn replace(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written?;
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
