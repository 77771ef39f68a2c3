//! The `tessera-node-agent` process: its flags ([`args`]), the assembly of
//! its parts ([`run`]), each background loop owned and named
//! ([`crate::supervise`]), and the drain on stop ([`drain`]).

mod args;
mod drain;
mod mps_host;
mod signal;

use std::{sync::Arc, time::Duration};

use tessera_api::v1alpha1::NodeSettings;

pub use args::{Args, BackendKind, parse_defaults};
pub use mps_host::{MpsArgs, SUBCOMMAND as MPS_SUBCOMMAND, run_mps_host};

use crate::{
    Error,
    backend::{self, Backend, FakeBackend, NvmlBackend},
    install, inventory, lease,
    mps::MpsManager,
    plugin::{self, Endpoint, HostPaths, PluginState, Service},
    publish,
    supervise::{self, Loops},
    view::NodeView,
};

/// A client from `--kubeconfig`, or the default lookup without it.
pub async fn client(args: &Args) -> Result<kube::Client, Error> {
    let Some(path) = &args.kubeconfig else {
        return kube::Client::try_default().await.map_err(Error::kube(
            "connecting to the API server (in-cluster or KUBECONFIG)",
        ));
    };
    let kubeconfig = |source| Error::Kubeconfig {
        path: path.clone(),
        source,
    };
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(path).map_err(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(kubeconfig)?;
    kube::Client::try_from(config).map_err(Error::kube(format!(
        "a client from {} (--kubeconfig)",
        path.display()
    )))
}

/// Runs the agent until the process is stopped.
pub async fn run(args: Args, defaults: NodeSettings, client: kube::Client) -> Result<(), Error> {
    if let Some(from) = &args.install_interposer_from {
        let installed = install::install_interposer(from, &args.interposer_library)?;
        tracing::info!(
            from = %from.display(),
            to = %args.interposer_library.display(),
            ?installed,
            "interposer installed"
        );
    }
    let backend: Arc<dyn Backend> = match args.backend {
        BackendKind::Nvml => Arc::new(NvmlBackend::new()?),
        BackendKind::Fake => Arc::new(FakeBackend::new(
            args.fake_gpus_file.clone().unwrap_or_default(),
            args.state_dir.join("fake-gpu-mig.json"),
        )),
    };
    let physical = backend::watch(backend.clone(), Duration::from_millis(args.gpu_poll_millis))?;
    let by_field = tessera_kubekit::selectors::serves_field_selector(
        &kube::Api::<tessera_api::v1alpha1::VgpuAllocation>::all(client.clone()),
        &format!("spec.nodeName={}", args.node_name),
    )
    .await;
    let view = NodeView::spawn(client.clone(), &args.node_name, by_field);
    // Nothing of DRA runs where the cluster does not serve it (Kubernetes
    // before 1.34, or resource.k8s.io/v1 turned off); the offer then never
    // asks for the DRA door.
    let dra = crate::dra::dra_served(&client).await;
    if !dra {
        tracing::info!(
            api = crate::dra::discovery::RESOURCE_V1,
            "the cluster does not serve DRA; serving the GPUs through the device plugin only"
        );
    }
    let offers = inventory::track(view.clone(), defaults, physical, dra).await;

    std::fs::create_dir_all(&args.state_dir)
        .map_err(Error::io(format!("creating {}", args.state_dir.display())))?;
    let preload = args.state_dir.join("ld.so.preload");
    let installed = install::install_preload(&preload)?;
    tracing::info!(path = %preload.display(), ?installed, "preload list installed");
    let paths = HostPaths {
        library: args.interposer_library.clone(),
        preload,
        regions: args.state_dir.join("containers"),
        limits: args.state_dir.join("limits"),
    };

    let doors = crate::door::track(view.clone(), offers.clone(), dra).await;
    let (plugin_state, plugin_states) = tokio::sync::watch::channel(PluginState::NotRegistered);
    let lease_lapsed = Arc::new(tokio::sync::Notify::new());
    let mut loops = Loops::default();
    loops.spawn(
        "GpuNode publisher",
        publish::gpu_node(
            client.clone(),
            args.node_name.clone(),
            offers.clone(),
            doors.clone(),
            plugin_states.clone(),
            lease_lapsed.clone(),
        ),
    );
    if dra {
        loops.spawn(
            "ResourceSlice publisher",
            crate::dra::publish::keep(view.clone(), offers.clone(), doors.clone()),
        );
        // Claims are prepared whatever the door: one allocated just before
        // a switch away from DRA still starts (the switch waits for it).
        let service = crate::dra::service::DraService::new(
            view.clone(),
            offers.clone(),
            paths.clone(),
            args.cdi_dir.clone(),
        );
        let sockets = crate::dra::server::Sockets {
            plugins_dir: args.kubelet_plugins_dir.clone(),
            registry_dir: args.plugins_registry_dir.clone(),
        };
        loops.spawn("DRA claim reconciler", service.clone().reconcile());
        loops.spawn(
            "DRA plugin server",
            crate::dra::server::run(sockets, service),
        );
    }
    // The device plugin offers nothing while the node serves through DRA.
    let plugin_offers = crate::door::gate(offers.clone(), doors);
    let lease_site = args.lease_site();
    // A stop of this node's agent closed the node; this start opens it.
    drain::reopen(&client, &args.node_name).await;
    // Owned apart: stopped and awaited before the Lease is deleted.
    let mut lease = tokio::spawn(lease::keep(
        client.clone(),
        lease_site.clone(),
        format!("tessera-node-agent/{}", args.node_name),
        lease_lapsed,
    ));
    let metrics = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(Error::io(format!("listening on {}", args.metrics_addr)))?;
    let addr = metrics
        .local_addr()
        .map_err(Error::io("the metrics listener"))?;
    tracing::info!(%addr, "metrics listening");
    if let Some(server) = args.profiling.bind().await? {
        loops.spawn("profiling server", async move {
            if let Err(error) = server.run().await {
                tracing::error!(%error, "profiling server stopped");
            }
        });
    }
    loops.spawn(
        "region sharing marker",
        crate::monitor::mark_sharing(view.clone(), paths.regions.clone()),
    );
    loops.spawn(
        "compute arbiter",
        crate::monitor::arbiter::run(view.clone(), paths.regions.clone()),
    );
    loops.spawn(
        "region collector",
        crate::monitor::collect_regions(
            view.clone(),
            vec![paths.regions.clone(), paths.limits.clone()],
        ),
    );
    loops.spawn(
        "metrics server",
        crate::monitor::serve(
            metrics,
            crate::monitor::Sources {
                view: view.clone(),
                offers: offers.clone(),
                regions: paths.regions.clone(),
                backend: backend.clone(),
                legacy: args.legacy_metrics,
                plugin: plugin_states.clone(),
                core_rates: Default::default(),
            },
        ),
    );
    let endpoint = Endpoint {
        dir: args.device_plugin_dir.clone(),
        resource: args.resource_name.clone(),
    };
    let mig = Arc::new(crate::mig::MigManager::new(backend));
    loops.spawn(
        "MIG cleaner",
        crate::mig::clean_every_pass(mig.clone(), offers.clone(), view.clone()),
    );
    let mps = Arc::new(MpsManager::new(
        mps_host::control(args.backend, &args.mps_control),
        args.state_dir.join("mps"),
    ));
    loops.spawn(
        "MPS hand-off",
        crate::mps::hand_off(args.state_dir.join("mps"), offers.clone()),
    );
    loops.spawn(
        "static MIG plugins",
        plugin::static_mig::serve_profiles(
            args.device_plugin_dir.clone(),
            plugin_offers.clone(),
            args.device_list(),
        ),
    );
    loops.spawn(
        "static MIG holders",
        crate::static_holders::keep(
            view.clone(),
            offers.clone(),
            args.pod_resources_socket.clone(),
        ),
    );
    let modes = plugin::Modes {
        hami_core: Arc::new(crate::sharing::HamiCore::new(paths.clone())),
        dynamic_mig: Arc::new(crate::mig::DynamicMig::new(
            mig,
            view.clone(),
            plugin_offers.clone(),
        )),
        mps,
    };
    let (served, found) = plugin::served::Served::open(&args.state_dir)?;
    let served_file = served.path().display().to_string();
    match &found {
        plugin::served::Found::Unusable(why) => tracing::error!(
            file = %served_file,
            error = %why,
            "the record of answered containers is unusable: Allocate refuses pods locked before this start with several containers waiting, rather than guess which were answered"
        ),
        found => tracing::info!(file = %served_file, ?found, "the record of answered containers"),
    }
    let service = Service::new(
        view,
        plugin_offers,
        paths,
        args.device_list(),
        modes,
        served,
    );
    let stopping = plugin_state.clone();
    // The plugin keeps serving while the node drains.
    let mut plugin = tokio::spawn(plugin::run(endpoint, service, plugin_state));
    tracing::info!(loops = loops.len() + 2, "the agent runs");
    let ended = tokio::select! {
        () = signal::stop() => None,
        ended = loops.ended() => Some(ended),
        joined = &mut plugin => Some(supervise::ended("device plugin server", joined)),
        joined = &mut lease => Some(supervise::ended("Lease keeper", joined)),
    };
    if let Some(ended) = ended {
        tracing::error!(error = %ended, "stopping");
        plugin.abort();
        lease.abort();
        loops.abort_all();
        return Err(ended);
    }
    stopping.send_replace(PluginState::Stopping);
    let agent = drain::Agent {
        reference: tessera_api::v1alpha1::PodReference {
            namespace: lease_site.namespace.clone(),
            name: lease_site.name(),
            uid: args.pod_uid.clone().unwrap_or_else(|| lease_site.name()),
        },
        lease: lease_site.name(),
    };
    drain::drain(
        &client,
        &args.node_name,
        &agent,
        Duration::from_secs(args.drain_seconds),
    )
    .await;
    plugin.abort();
    // A clean stop leaves no Lease behind (uninstall removes everything).
    lease.abort();
    let _ = lease.await;
    lease::delete(&client, &lease_site).await;
    Ok(())
}
