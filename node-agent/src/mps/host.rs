//! The MPS host: the process (`tessera-node-agent mps-daemons`, the chart's
//! `<release>-mps` DaemonSet) that runs the node's MPS control daemons, apart
//! from the agent so that they outlive it.
//!
//! Every [`super::PASS`] it reads the agent's hand-off ([`super::handoff`])
//! and reconciles: a daemon for each GPU listed (started, or restarted when
//! it died), `quit` for the daemons of GPUs no longer listed. It talks to
//! no API server: the hand-off file is all it reads, so it needs no
//! credentials, and it keeps its daemons while the agent is away.

use std::{path::PathBuf, sync::Arc};

use super::{MpsManager, PASS, handoff};

/// Keeps the daemons the agent asks for under `root`, for as long as the
/// returned future is polled.
pub async fn run(manager: Arc<MpsManager>, root: PathBuf) {
    tracing::info!(file = %handoff::path(&root).display(), "the MPS host keeps the daemons the agent hands over");
    crate::periodic::every("MPS host", PASS, move || pass(&manager, &root)).await;
}

/// One pass: reads the hand-off and reconciles. A hand-off that cannot be
/// read changes nothing (the daemons the clients use keep running).
pub fn pass(manager: &MpsManager, root: &std::path::Path) {
    let wanted = match handoff::read(root) {
        Ok(wanted) => wanted,
        Err(error) => {
            tracing::warn!(%error, "the agent's MPS hand-off cannot be read; the daemons stay as they are");
            return;
        }
    };
    for (gpu, error) in manager.reconcile(&wanted) {
        tracing::warn!(%gpu, %error, "MPS control daemon");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::mps::{FakeControl, MpsControl};

    #[test]
    fn the_host_follows_the_hand_off_and_keeps_its_daemons_through_an_unreadable_one() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mps");
        let host = MpsManager::new(Arc::new(FakeControl), &root);
        let agent = MpsManager::new(Arc::new(FakeControl), &root);
        let answers = |uuid: &str| {
            FakeControl
                .command(&host.daemon(uuid).unwrap(), "get_server_list")
                .is_ok()
        };
        // Nothing handed over yet: no daemon, and the agent's Allocate
        // says who runs them.
        pass(&host, &root);
        let error = agent
            .answering("GPU-a", std::time::Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(error.contains("mps-daemons"), "{error}");
        handoff::write(&root, &BTreeSet::from(["GPU-a".to_owned()])).unwrap();
        pass(&host, &root);
        assert!(answers("GPU-a"));
        let daemon = agent.answering("GPU-a", std::time::Duration::ZERO).unwrap();
        assert_eq!(daemon.pipe_dir, root.join("GPU-a/pipe"));
        // A planted symlink over the hand-off: nothing changes.
        let file = handoff::path(&root);
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/dev/null", &file).unwrap();
        pass(&host, &root);
        assert!(answers("GPU-a"), "an unreadable hand-off quits nothing");
        // The GPU leaves MPS mode: its daemon quits.
        std::fs::remove_file(&file).unwrap();
        handoff::write(&root, &BTreeSet::new()).unwrap();
        pass(&host, &root);
        assert!(!answers("GPU-a"));
    }
}
