//! The agent's background loops, each owned under its name.
//!
//! None of them is meant to end while the agent runs. One that does (it
//! returned, or it panicked) stops the agent with an error naming it, so
//! the kubelet restarts the agent's pod and every loop starts over from the
//! cluster's state, instead of the agent running on without it (a GpuNode
//! no longer published, a Lease no longer renewed, regions no longer
//! watched) while saying nothing.

use std::{collections::HashMap, future::Future};

use tokio::task::{Id, JoinSet};

use crate::Error;

/// The loops of one agent.
#[derive(Default)]
pub struct Loops {
    tasks: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl Loops {
    /// Runs `task` as the loop `name`.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.tasks.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// How many loops run.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether no loop runs.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Waits until a loop ends, and says which and how; never returns while
    /// no loop runs.
    pub async fn ended(&mut self) -> Error {
        let Some(joined) = self.tasks.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let id = match &joined {
            Ok((id, ())) => *id,
            Err(error) => error.id(),
        };
        let name = self.names.remove(&id).unwrap_or("(unnamed)");
        ended(name, joined.map(|_| ()))
    }

    /// Stops every loop.
    pub fn abort_all(&mut self) {
        self.tasks.abort_all();
    }
}

/// The error for loop `name` having ended as `joined` says.
pub fn ended(name: &'static str, joined: Result<(), tokio::task::JoinError>) -> Error {
    let how = match joined {
        Ok(()) => "returned".to_owned(),
        Err(error) if error.is_panic() => "panicked".to_owned(),
        Err(error) => format!("was cancelled ({error})"),
    };
    Error::LoopEnded { name, how }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_loop_that_ends_or_panics_is_named() {
        let mut loops = Loops::default();
        loops.spawn("forever", std::future::pending());
        loops.spawn("publish", async {});
        let ended = loops.ended().await.to_string();
        assert!(ended.contains("publish loop returned"), "{ended}");
        loops.spawn("lease", async { panic!("boom") });
        let ended = loops.ended().await.to_string();
        assert!(ended.contains("lease loop panicked"), "{ended}");
        assert_eq!(loops.len(), 1, "the loop that runs on is still owned");
        loops.abort_all();
        let ended = loops.ended().await.to_string();
        assert!(ended.contains("forever loop was cancelled"), "{ended}");
        assert!(loops.is_empty());
    }
}
