//! The agent's device-plugin service over the fake GPU backend, as the
//! gRPC and restart tests build it: the GPUs of `gpus` (YAML), the node's
//! view through `client`, host paths and state under `dir`.

use std::{path::Path, sync::Arc, time::Duration};

use tessera_node_agent::{
    backend::{self, FakeBackend},
    inventory,
    plugin::{self, HostPaths, Service, served::Served},
    view::NodeView,
};

/// The service for `node`, recording served containers in `state`.
pub async fn service(
    client: kube::Client,
    node: &str,
    dir: &Path,
    gpus: &Path,
    state: &Path,
) -> Service {
    let backend = Arc::new(FakeBackend::new(gpus, dir.join("mig-state.json")));
    let physical = backend::watch(backend.clone(), Duration::from_millis(100)).unwrap();
    let view = NodeView::spawn(client, node, true);
    let offers = inventory::track(view.clone(), Default::default(), physical, true).await;
    let paths = HostPaths {
        library: "/opt/lib.so".into(),
        preload: dir.join("ld.so.preload"),
        regions: dir.join("containers"),
        limits: dir.join("limits"),
    };
    Service::new(
        view.clone(),
        offers.clone(),
        paths.clone(),
        Default::default(),
        plugin::Modes {
            hami_core: Arc::new(tessera_node_agent::sharing::HamiCore::new(paths)),
            dynamic_mig: Arc::new(tessera_node_agent::mig::DynamicMig::new(
                Arc::new(tessera_node_agent::mig::MigManager::new(backend)),
                view,
                offers,
            )),
            mps: Arc::new(tessera_node_agent::mps::MpsManager::new(
                Arc::new(tessera_node_agent::mps::FakeControl),
                dir.join("mps"),
            )),
        },
        Served::open(state).unwrap().0,
    )
}
