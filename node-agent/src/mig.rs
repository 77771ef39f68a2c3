//! Dynamic MIG on the node: the instance each live allocation's MIG slice
//! names is created at Allocate and destroyed once no live allocation names
//! it, so an empty GPU returns to a free geometry.
//!
//! The scheduler chose the profile and the placement (`tessera_api::mig`);
//! the agent only makes the hardware match the ledger. Both directions are
//! idempotent: an Allocate retried by the kubelet, or served again after an
//! agent restart, finds its instance and reuses it; an instance no live
//! allocation names is destroyed on the next pass, whoever made it, once it
//! is older than [`GRACE`] (an Allocate may have just made it for an
//! allocation the agent's watch has not shown yet).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tessera_api::{
    mig,
    v1alpha1::{MigLayout, MigSlice, ServedMigInstance, VgpuAllocation},
};
use tokio::sync::watch;

use crate::{
    Error,
    backend::Backend,
    contract::Contract,
    holders::{MigHolders, wanted},
    offer::Offer,
    sharing::mode::{Container, Mode, Serving},
    view::NodeView,
};

/// How long a new instance is safe from the clean-up pass.
pub const GRACE: Duration = Duration::from_secs(30);

/// How often the clean-up pass runs.
pub const PASS: Duration = Duration::from_secs(2);

/// Creates and destroys the node's dynamic MIG instances.
pub struct MigManager {
    backend: Arc<dyn Backend>,
    /// Instances this agent created, by UUID, and when.
    created: Mutex<HashMap<String, Instant>>,
    /// One change to the hardware at a time.
    turn: Mutex<()>,
    /// How long a new instance is safe from [`MigManager::clean`].
    grace: Duration,
}

impl MigManager {
    /// A manager working through `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            created: Mutex::default(),
            turn: Mutex::default(),
            grace: GRACE,
        }
    }

    /// The same manager with another grace period for new instances.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Makes sure the instances `slices` name exist, for the allocation
    /// `holder`; returns their UUIDs in order. Blocking (NVML is).
    ///
    /// An instance already at the placement with the profile is reused. An
    /// instance in the way that no other live allocation holds is destroyed
    /// first (its pod is gone); one that another allocation holds is an
    /// error, because the scheduler never gives two allocations one slice.
    pub fn ensure(
        &self,
        holder: &str,
        slices: &[(String, MigSlice)],
        layouts: &HashMap<String, MigLayout>,
        holders: &MigHolders,
    ) -> Result<Vec<String>, Error> {
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let mut uuids = Vec::with_capacity(slices.len());
        for (gpu, slice) in slices {
            let layout = layouts.get(gpu).ok_or_else(|| {
                Error::Mig(format!(
                    "GPU {gpu} is not offered for dynamic MIG on this node (operatingMode mig, migStrategy none)"
                ))
            })?;
            let profile = layout
                .profiles
                .iter()
                .find(|p| p.name == slice.profile)
                .ok_or_else(|| {
                    Error::Mig(format!("GPU {gpu} has no MIG profile {}", slice.profile))
                })?;
            let wanted = mig::span(slice.placement).ok_or_else(|| {
                Error::Mig(format!(
                    "GPU {gpu}: placement {}:{} is off the GPU",
                    slice.placement.start, slice.placement.size
                ))
            })?;
            let instances = self.backend.mig_instances(gpu)?;
            if let Some(found) = instances
                .iter()
                .find(|i| i.placement == slice.placement && i.profile == slice.profile)
            {
                tracing::info!(gpu, instance = %found.uuid, holder, "reusing the MIG instance already at the placement");
                uuids.push(found.uuid.clone());
                continue;
            }
            for instance in instances
                .iter()
                .filter(|i| mig::span(i.placement).is_some_and(|m| m & wanted != 0))
            {
                match holders.get(&(gpu.clone(), instance.placement)) {
                    Some(other) if other != holder => {
                        return Err(Error::Mig(format!(
                            "GPU {gpu}: placement {}:{} overlaps instance {} of {other}",
                            slice.placement.start, slice.placement.size, instance.uuid
                        )));
                    }
                    _ => {
                        tracing::info!(gpu, instance = %instance.uuid, "destroying an instance no live allocation holds, in the way");
                        self.backend.destroy_mig(gpu, &instance.uuid)?;
                    }
                }
            }
            let created = self.backend.create_mig(gpu, profile, slice.placement)?;
            tracing::info!(gpu, instance = %created.uuid, profile = %created.profile, start = slice.placement.start, holder, "created a MIG instance");
            self.created
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(created.uuid.clone(), Instant::now());
            uuids.push(created.uuid);
        }
        Ok(uuids)
    }

    /// One clean-up pass: destroys every instance on the node's dynamic-MIG
    /// GPUs that no live allocation wants (same GPU, placement and profile)
    /// and that is older than [`GRACE`]. Returns how many were destroyed; a
    /// destroy that fails (the instance is in use) is retried next pass.
    pub fn clean(&self, offer: &Offer, allocations: &[VgpuAllocation]) -> usize {
        if !Mode::of(&offer.resolved.settings).makes_mig_instances() {
            return 0;
        }
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let wanted = wanted(allocations);
        let mut destroyed = 0;
        for gpu in offer.devices.iter().filter(|d| d.mig.is_some()) {
            let instances = match self.backend.mig_instances(&gpu.uuid) {
                Ok(instances) => instances,
                Err(error) => {
                    tracing::warn!(gpu = %gpu.uuid, %error, "listing MIG instances failed");
                    continue;
                }
            };
            for instance in instances {
                let key = (gpu.uuid.clone(), instance.placement);
                if wanted
                    .get(&key)
                    .is_some_and(|(_, p)| *p == instance.profile)
                {
                    continue;
                }
                let young = self
                    .created
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&instance.uuid)
                    .is_some_and(|at| at.elapsed() < self.grace);
                if young {
                    continue;
                }
                match self.backend.destroy_mig(&gpu.uuid, &instance.uuid) {
                    Ok(()) => {
                        tracing::info!(gpu = %gpu.uuid, instance = %instance.uuid, profile = %instance.profile, "destroyed a MIG instance no live allocation holds");
                        self.created
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&instance.uuid);
                        destroyed += 1;
                    }
                    Err(error) => {
                        tracing::warn!(gpu = %gpu.uuid, instance = %instance.uuid, %error, "destroying a MIG instance failed; trying again next pass")
                    }
                }
            }
        }
        destroyed
    }
}

/// Serves dynamic-MIG containers: creates their instances.
pub struct DynamicMig {
    manager: Arc<MigManager>,
    view: NodeView,
    offers: watch::Receiver<Offer>,
}

impl DynamicMig {
    /// Creates instances through `manager`, on the GPUs `offers` lays out,
    /// clear of those the node's allocations (`view`) hold.
    pub fn new(manager: Arc<MigManager>, view: NodeView, offers: watch::Receiver<Offer>) -> Self {
        Self {
            manager,
            view,
            offers,
        }
    }
}

impl Serving for DynamicMig {
    fn serve(&self, container: &Container) -> Result<Contract, Error> {
        let slices: Vec<_> = container
            .slices
            .iter()
            .filter_map(|s| Some((s.uuid.clone(), s.mig.clone()?)))
            .collect();
        if slices.len() != container.slices.len() {
            return Err(Error::Mig(format!(
                "pod {} container {}: {} of its {} slices are MIG instances; a container's slices are all MIG or none",
                container.holder,
                container.name,
                slices.len(),
                container.slices.len()
            )));
        }
        let layouts: HashMap<String, MigLayout> = self
            .offers
            .borrow()
            .devices
            .iter()
            .filter_map(|d| Some((d.uuid.clone(), d.mig.clone()?)))
            .collect();
        let holders = crate::holders::holders(&self.view.allocations());
        let uuids = self
            .manager
            .ensure(&container.holder, &slices, &layouts, &holders)?;
        Ok(Contract {
            mig_instances: slices
                .iter()
                .zip(&uuids)
                .map(|((gpu, _), uuid)| ServedMigInstance {
                    container: container.name.clone(),
                    gpu: gpu.clone(),
                    uuid: uuid.clone(),
                })
                .collect(),
            visible: uuids,
            ..Contract::default()
        })
    }
}

/// Runs [`MigManager::clean`] every [`PASS`] while polled.
pub async fn clean_every_pass(
    manager: Arc<MigManager>,
    offers: watch::Receiver<Offer>,
    view: NodeView,
) {
    crate::periodic::every("MIG cleaner", PASS, move || {
        let offer = offers.borrow().clone();
        manager.clean(&offer, &view.allocations());
    })
    .await;
}

#[cfg(test)]
mod tests {
    use tessera_api::{
        testing::{allocation, container, slice},
        v1alpha1::{AllocationPhase, NodeSettings, OperatingMode, VgpuAllocationStatus},
    };

    use super::*;
    use tessera_api::v1alpha1::MigPlacement;

    use crate::{backend::FakeBackend, holders::holders, settings::offered};

    const GPU: &str = "GPU-a100-0";

    fn node(dir: &std::path::Path, extra: &str) -> Arc<FakeBackend> {
        let gpus = dir.join("gpus.yaml");
        std::fs::write(
            &gpus,
            format!("devices:\n- {{uuid: {GPU}, index: 0, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920}}\nmig:\n  enabled: [{GPU}]\n{extra}"),
        )
        .unwrap();
        Arc::new(FakeBackend::new(gpus, dir.join("state.json")))
    }

    fn offer(backend: &FakeBackend, allocations: &[VgpuAllocation]) -> Offer {
        let settings = NodeSettings {
            operating_mode: OperatingMode::Mig,
            ..NodeSettings::default()
        };
        let devices = offered(
            &backend.devices().unwrap(),
            &settings,
            &holders(allocations),
        );
        Offer {
            resolved: tessera_api::node_config::resolve("n1", &Default::default(), &settings, &[]),
            devices,
        }
    }

    fn mig_allocation(name: &str, profile: &str, start: u32, size: u32) -> VgpuAllocation {
        let mut device = slice(GPU, 0, 9728, 14);
        device.mig = Some(MigSlice {
            profile: profile.into(),
            placement: MigPlacement { start, size },
        });
        allocation(name, &format!("uid-{name}"), "n1")
            .namespace("ml")
            .container(container("main", vec![device]))
            .build()
    }

    /// The (GPU, MIG slice) pairs of an allocation's first container.
    fn mig_slices(allocation: &VgpuAllocation) -> Vec<(String, MigSlice)> {
        allocation.spec.containers[0]
            .devices
            .iter()
            .map(|d| (d.uuid.clone(), d.mig.clone().unwrap()))
            .collect()
    }

    fn layouts(offer: &Offer) -> HashMap<String, MigLayout> {
        offer
            .devices
            .iter()
            .filter_map(|d| Some((d.uuid.clone(), d.mig.clone()?)))
            .collect()
    }

    #[test]
    fn allocate_creates_once_and_a_retry_reuses_the_instance() {
        let dir = tempfile::tempdir().unwrap();
        let backend = node(dir.path(), "");
        let manager = MigManager::new(backend.clone());
        let a = mig_allocation("a", "1g.10gb", 6, 1);
        let offer = offer(&backend, std::slice::from_ref(&a));
        let slices = mig_slices(&a);
        let first = manager
            .ensure(
                "ml/a",
                &slices,
                &layouts(&offer),
                &holders(std::slice::from_ref(&a)),
            )
            .unwrap();
        let again = manager
            .ensure(
                "ml/a",
                &slices,
                &layouts(&offer),
                &holders(std::slice::from_ref(&a)),
            )
            .unwrap();
        assert_eq!(first, again);
        assert!(first[0].starts_with("MIG-"));
        let instances = backend.mig_instances(GPU).unwrap();
        assert_eq!(instances.len(), 1);
        assert_eq!(instances[0].placement, MigPlacement { start: 6, size: 1 });
        // The GpuNode names the holder.
        let published = &offer.devices[0];
        assert!(published.mig.is_some());
        let offer = self::offer(&backend, std::slice::from_ref(&a));
        assert_eq!(
            offer.devices[0].mig_instances[0].held_by.as_deref(),
            Some("ml/a")
        );
    }

    #[test]
    fn an_instance_held_by_another_allocation_is_never_touched() {
        let dir = tempfile::tempdir().unwrap();
        let backend = node(dir.path(), "");
        let manager = MigManager::new(backend.clone());
        let a = mig_allocation("a", "2g.20gb", 4, 2);
        let all = vec![a.clone()];
        let offer = offer(&backend, &all);
        let mine = mig_slices(&a);
        manager
            .ensure("ml/a", &mine, &layouts(&offer), &holders(&all))
            .unwrap();
        // A corrupt ledger: b wants 3g.40gb at 4, over a's instance.
        let b = mig_allocation("b", "3g.40gb", 4, 4);
        let theirs = mig_slices(&b);
        let error = manager
            .ensure("ml/b", &theirs, &layouts(&offer), &holders(&all))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("overlaps instance") && error.contains("ml/a"),
            "{error}"
        );
        assert_eq!(backend.mig_instances(GPU).unwrap().len(), 1);
    }

    #[test]
    fn released_allocations_lose_their_instances_and_orphans_in_the_way_go() {
        let dir = tempfile::tempdir().unwrap();
        let backend = node(dir.path(), "");
        let manager = MigManager::new(backend.clone()).with_grace(Duration::ZERO);
        let mut a = mig_allocation("a", "3g.40gb", 4, 4);
        let offer_a = offer(&backend, std::slice::from_ref(&a));
        let slices = mig_slices(&a);
        manager
            .ensure(
                "ml/a",
                &slices,
                &layouts(&offer_a),
                &holders(std::slice::from_ref(&a)),
            )
            .unwrap();
        assert_eq!(
            manager.clean(&offer_a, std::slice::from_ref(&a)),
            0,
            "a is live"
        );
        a.status = Some(VgpuAllocationStatus {
            phase: Some(AllocationPhase::Released),
            ..Default::default()
        });
        // Before the pass runs, b is placed where a was: the orphan goes first.
        let b = mig_allocation("b", "1g.20gb", 4, 2);
        let all = vec![a.clone(), b.clone()];
        let slices = mig_slices(&b);
        manager
            .ensure("ml/b", &slices, &layouts(&offer_a), &holders(&all))
            .unwrap();
        let left = backend.mig_instances(GPU).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].profile, "1g.20gb");
        // b goes too: the pass empties the GPU.
        assert_eq!(manager.clean(&offer_a, &[]), 1);
        assert!(backend.mig_instances(GPU).unwrap().is_empty());
    }

    #[test]
    fn a_busy_instance_is_kept_and_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let backend = node(dir.path(), "");
        let manager = MigManager::new(backend.clone()).with_grace(Duration::ZERO);
        let a = mig_allocation("a", "1g.10gb", 6, 1);
        let offer = offer(&backend, &[]);
        let slices = mig_slices(&a);
        let uuid = manager
            .ensure("ml/a", &slices, &layouts(&offer), &MigHolders::new())
            .unwrap()
            .remove(0);
        let busy = node(dir.path(), &format!("  busy: [{uuid}]\n"));
        assert_eq!(
            MigManager::new(busy)
                .with_grace(Duration::ZERO)
                .clean(&offer, &[]),
            0
        );
        assert_eq!(backend.mig_instances(GPU).unwrap().len(), 1);
        // No longer in use: the next pass destroys it.
        node(dir.path(), "");
        assert_eq!(manager.clean(&offer, &[]), 1);
    }

    #[test]
    fn create_failures_and_bad_placements_are_nvmls_errors() {
        let dir = tempfile::tempdir().unwrap();
        let backend = node(dir.path(), "  failCreate: true\n");
        let offer = offer(&backend, &[]);
        let layout = offer.devices[0].mig.clone().unwrap();
        let profile = layout
            .profiles
            .iter()
            .find(|p| p.name == "3g.40gb")
            .unwrap();
        let error = backend
            .create_mig(GPU, profile, MigPlacement { start: 4, size: 4 })
            .unwrap_err()
            .to_string();
        assert!(error.contains("failCreate"), "{error}");
        let backend = node(dir.path(), "");
        let error = backend
            .create_mig(GPU, profile, MigPlacement { start: 2, size: 4 })
            .unwrap_err()
            .to_string();
        assert!(error.contains("may not be placed at 2:4"), "{error}");
        backend
            .create_mig(GPU, profile, MigPlacement { start: 4, size: 4 })
            .unwrap();
        let small = layout
            .profiles
            .iter()
            .find(|p| p.name == "1g.10gb")
            .unwrap();
        let error = backend
            .create_mig(GPU, small, MigPlacement { start: 5, size: 1 })
            .unwrap_err()
            .to_string();
        assert!(error.contains("overlaps"), "{error}");
        // The instances outlive the backend, as a GPU's outlive the agent.
        let restarted = node(dir.path(), "");
        assert_eq!(restarted.mig_instances(GPU).unwrap().len(), 1);
    }
}
