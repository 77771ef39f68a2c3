//! The GPU pods Filter has just answered for, by UID, so Bind does not read
//! the pod back from the API server: kube-scheduler sends the whole pod to
//! Filter and only its name and UID to Bind. A pod's containers and their
//! GPU requests cannot change, and the binding is made with the UID as a
//! precondition, so a copy from Filter decides as a fresh read would; a
//! pod Filter never saw (another replica answered, or it was forgotten) is
//! read as before. One GET fewer per GPU pod.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
};

use k8s_openapi::api::core::v1::Pod;

/// How many pods are remembered (the oldest are forgotten first).
const KEPT: usize = 4096;

/// Pods by UID, in the order Filter saw them.
#[derive(Debug, Default)]
pub struct SeenPods {
    pods: Mutex<(HashMap<String, Pod>, VecDeque<String>)>,
}

impl SeenPods {
    /// Remembers `pod` (replacing an earlier copy of it).
    pub fn remember(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let mut guard = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let (pods, order) = &mut *guard;
        if pods.insert(uid.clone(), pod.clone()).is_none() {
            order.push_back(uid);
        }
        while order.len() > KEPT {
            if let Some(oldest) = order.pop_front() {
                pods.remove(&oldest);
            }
        }
    }

    /// The trace the pod with this UID continues, if Filter saw it and it
    /// carries one ([`crate::telemetry::pod_parent`]).
    pub fn trace_parent(&self, uid: &str) -> Option<tessera_api::v1alpha1::TraceContext> {
        let guard = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        crate::telemetry::pod_parent(guard.0.get(uid)?.metadata.annotations.as_ref())
    }

    /// The pod with this UID, if Filter saw it; forgets it.
    pub fn take(&self, uid: &str) -> Option<Pod> {
        let mut guard = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let (pods, order) = &mut *guard;
        let pod = pods.remove(uid)?;
        order.retain(|u| u != uid);
        Some(pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.uid = Some(uid.into());
        pod
    }

    #[test]
    fn a_pod_is_taken_once_and_the_oldest_are_forgotten() {
        let seen = SeenPods::default();
        seen.remember(&Pod::default());
        seen.remember(&pod("a"));
        seen.remember(&pod("a"));
        assert_eq!(seen.take("a").unwrap().metadata.uid.as_deref(), Some("a"));
        assert!(seen.take("a").is_none());
        for i in 0..=KEPT {
            seen.remember(&pod(&i.to_string()));
        }
        assert!(seen.take("0").is_none(), "the oldest is gone");
        assert!(seen.take(&KEPT.to_string()).is_some());
    }
}
