//! The `tessera-controller` process: flags and wiring.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use clap::Parser;
use tokio::net::TcpListener;

use crate::{
    Error, cache::Cache, config::Config, extender::Extender, metrics::Metrics,
    projection::Projection, webhook::Webhook,
};

/// Tessera's control plane: kube-scheduler extender (filter, prioritize, bind),
/// mutating webhook, and lifecycle controllers.
#[derive(Parser, Debug, Clone)]
#[command(name = "tessera-controller", version, about)]
pub struct Args {
    /// Cluster-wide settings (YAML): resource names, request defaults,
    /// policies, NodeLock timing. See docs/configuration.md.
    #[arg(long, env = "TESSERA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address the extender listens on (plain HTTP; kube-scheduler runs
    /// beside it and nothing else should reach it: keep it on loopback).
    #[arg(long, env = "TESSERA_EXTENDER_ADDR", default_value = "127.0.0.1:8888")]
    pub extender_addr: SocketAddr,
    /// Address of `/metrics`, `/healthz` and `/readyz` for Prometheus and the
    /// kubelet's probes (plain HTTP; HAMi's scheduler metrics port).
    #[arg(long, env = "TESSERA_METRICS_ADDR", default_value = "0.0.0.0:9395")]
    pub metrics_addr: SocketAddr,
    /// Address the mutating webhook listens on (HTTPS).
    #[arg(long, env = "TESSERA_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// PEM certificate the webhook serves (the API server must trust its
    /// CA). Reloaded when it changes, checked every 30 s.
    #[arg(long, env = "TESSERA_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,
    /// PEM private key of `--tls-cert-file`.
    #[arg(long, env = "TESSERA_TLS_KEY_FILE")]
    pub tls_key_file: PathBuf,
    /// Namespace of the coordination Lease that elects the replica running
    /// the lifecycle controllers.
    #[arg(long, env = "TESSERA_LEASE_NAMESPACE", default_value = "kube-system")]
    pub lease_namespace: String,
    /// Namespace of the node agents' Leases (`tessera-agent-<node>`), watched
    /// for `tessera_agent_lease_age_seconds`; empty: not watched.
    #[arg(
        long,
        env = "TESSERA_AGENT_LEASE_NAMESPACE",
        default_value = "kube-node-lease"
    )]
    pub agent_lease_namespace: String,
    /// Namespace of the node agents' DaemonSet pods. A node whose agent pod
    /// is not Ready (its container died: the kubelet reports it within about
    /// a second) takes no GPU pod. Empty: not watched.
    #[arg(long, env = "TESSERA_AGENT_NAMESPACE", default_value = "")]
    pub agent_namespace: String,
    /// Label selector of the node agents' pods in `--agent-namespace`.
    #[arg(
        long,
        env = "TESSERA_AGENT_SELECTOR",
        default_value = "app.kubernetes.io/component=node-agent"
    )]
    pub agent_selector: String,
    /// How often the leader reads every node agent's `/metrics` for the
    /// tuning advice, seconds.
    #[arg(
        long,
        env = "TESSERA_TUNING_INTERVAL_SECONDS",
        default_value_t = 300,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub tuning_interval_seconds: u64,
    /// How far back the tuning advice looks, seconds (6 hours).
    #[arg(
        long,
        env = "TESSERA_TUNING_WINDOW_SECONDS",
        default_value_t = 21_600,
        value_parser = clap::value_parser!(u64).range(60..=604_800)
    )]
    pub tuning_window_seconds: u64,
    /// How long a pool of nodes must have been seen before any advice,
    /// seconds (1 hour); at most the window.
    #[arg(
        long,
        env = "TESSERA_TUNING_MIN_OBSERVED_SECONDS",
        default_value_t = 3_600,
        value_parser = clap::value_parser!(u64).range(0..=604_800)
    )]
    pub tuning_min_observed_seconds: u64,
    /// How long a pod must have waited for a GPU to count in the tuning
    /// advice, seconds (10 minutes: the tuning guide's Pending alert).
    #[arg(
        long,
        env = "TESSERA_TUNING_WAIT_SECONDS",
        default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub tuning_wait_seconds: u64,
    /// The least time between two writes of one GpuNodeConfig's tuning
    /// advice, seconds (10 minutes).
    #[arg(
        long,
        env = "TESSERA_TUNING_WRITE_GAP_SECONDS",
        default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub tuning_write_gap_seconds: u64,
    /// This replica's identity in the election (in a pod: its name).
    #[arg(long, env = "POD_NAME", default_value = "tessera-controller")]
    pub identity: String,
    /// `--profiling` and `--profiling-addr`.
    #[command(flatten)]
    pub profiling: tessera_profiling::ProfilingArgs,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "TESSERA_LOG", default_value = "info")]
    pub log: String,
}

impl Args {
    /// The tuning advice's settings from the `--tuning-*` flags.
    pub fn tuning(&self) -> Result<crate::tuning::Settings, Error> {
        if self.tuning_min_observed_seconds > self.tuning_window_seconds {
            return Err(Error::Config(format!(
                "--tuning-min-observed-seconds ({}) must not exceed --tuning-window-seconds ({}): no pool could ever be observed that long",
                self.tuning_min_observed_seconds, self.tuning_window_seconds
            )));
        }
        Ok(crate::tuning::Settings {
            interval: std::time::Duration::from_secs(self.tuning_interval_seconds),
            window: std::time::Duration::from_secs(self.tuning_window_seconds),
            thresholds: crate::engine::tuning::Thresholds {
                min_span: std::time::Duration::from_secs(self.tuning_min_observed_seconds),
                wait: std::time::Duration::from_secs(self.tuning_wait_seconds),
                ..Default::default()
            },
            write_gap: std::time::Duration::from_secs(self.tuning_write_gap_seconds),
        })
    }

    /// Reads the configuration file, or the defaults without one.
    pub fn load_config(&self) -> Result<Config, Error> {
        let Some(path) = &self.config else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Config::from_yaml(&text).map_err(|e| match e {
            // Name the file once: "invalid configuration: FILE: KEY: RULE".
            Error::Config(message) => Error::Config(format!("{}: {message}", path.display())),
            other => other,
        })
    }
}

/// Runs the controller with `config` (see [`Args::load_config`]) until the
/// process is stopped.
pub async fn run(args: Args, config: Config, client: kube::Client) -> Result<(), Error> {
    let Args {
        config: _,
        extender_addr,
        metrics_addr,
        webhook_addr,
        tls_cert_file,
        tls_key_file,
        lease_namespace,
        agent_lease_namespace,
        agent_namespace,
        agent_selector,
        identity,
        profiling,
        log: _,
        tuning_interval_seconds: _,
        tuning_window_seconds: _,
        tuning_min_observed_seconds: _,
        tuning_wait_seconds: _,
        tuning_write_gap_seconds: _,
    } = &args;
    let tuning = args.tuning()?;
    let config = Arc::new(config);
    let agent_lease_namespace =
        Some(agent_lease_namespace.clone()).filter(|namespace| !namespace.is_empty());
    let watches = crate::cache::Watches {
        agent_leases: agent_lease_namespace.clone(),
        agent_pods: Some((agent_namespace.clone(), agent_selector.clone()))
            .filter(|(namespace, _)| !namespace.is_empty()),
    };
    let election = crate::leader::Election {
        namespace: lease_namespace.clone(),
        name: "tessera-controller".into(),
        identity: identity.clone(),
        lease_duration: std::time::Duration::from_secs(15),
    };
    let (projection, mut election) = start_loops(
        client.clone(),
        &watches,
        election,
        agent_lease_namespace,
        config.request.clone(),
        tuning,
    );
    let metrics = Metrics::new(projection.clone(), config.request.clone());
    let webhook = std::net::TcpListener::bind(webhook_addr).map_err(Error::serve(format!(
        "listening on {webhook_addr} (--webhook-addr)"
    )))?;
    let addr = webhook
        .local_addr()
        .map_err(Error::serve("the webhook listener"))?;
    tracing::info!(%addr, "webhook listening");
    let webhook = serve_webhook(
        webhook,
        crate::webhook::certificate::CertificateFiles::new(tls_cert_file, tls_key_file),
        Webhook::new(config.clone(), projection.clone(), metrics.webhook.clone()),
    );
    let extender = TcpListener::bind(extender_addr)
        .await
        .map_err(Error::serve(format!(
            "listening on {extender_addr} (--extender-addr)"
        )))?;
    let addr = extender
        .local_addr()
        .map_err(Error::serve("the extender listener"))?;
    tracing::info!(%addr, "extender listening");
    let metrics_listener = TcpListener::bind(metrics_addr)
        .await
        .map_err(Error::serve(format!(
            "listening on {metrics_addr} (--metrics-addr)"
        )))?;
    let addr = metrics_listener
        .local_addr()
        .map_err(Error::serve("the metrics listener"))?;
    tracing::info!(%addr, "metrics listening");
    let profiling = profiling.bind().await?;
    let profiling = async move {
        match profiling {
            Some(server) => server.run().await.map_err(Error::from),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = serve_extender(extender, client, projection, config, metrics.clone()) => result,
        result = serve_metrics(metrics_listener, metrics) => result,
        result = webhook => result,
        result = profiling => result,
        // The election runs for the life of the process: its end is an error.
        joined = &mut election => Err(Error::LoopEnded {
            name: "leader election",
            how: match joined {
                Ok(()) => "returned".to_owned(),
                Err(error) if error.is_panic() => "panicked".to_owned(),
                Err(error) => format!("was cancelled ({error})"),
            },
        }),
    }
}

/// Starts the watches ([`Cache`], each kind once) and the projection they
/// feed, which every replica runs, and the lifecycle controllers on the same
/// watches while this replica wins `election`. Returns the projection the
/// extender, the webhook and the metrics read, and the election's task
/// (the lifecycle controllers run inside it), which never ends by itself.
pub fn start_loops(
    client: kube::Client,
    watches: &crate::cache::Watches,
    election: crate::leader::Election,
    agent_lease_namespace: Option<String>,
    request: tessera_scheduling::request::RequestConfig,
    tuning: crate::tuning::Settings,
) -> (Projection, tokio::task::JoinHandle<()>) {
    let cache = Cache::spawn(client.clone(), watches);
    let projection = Projection::spawn_on(&cache);
    // The extender tells kube-scheduler when nodes it turned pods away
    // from have room again.
    if let Some(freed) = projection.take_freed_nodes() {
        tokio::spawn(crate::extender::nudge_nodes(client.clone(), freed));
    }
    let leader_projection = projection.clone();
    let election = tokio::spawn(async move {
        election
            .run(client, move || {
                crate::lifecycle::run_with(
                    cache.clone(),
                    agent_lease_namespace.clone(),
                    request.clone(),
                    Some((leader_projection.clone(), tuning)),
                )
            })
            .await
    });
    (projection, election)
}

pub use crate::webhook::serve as serve_webhook;

/// Serves the extender on `listener` until the task is dropped (with
/// `/metrics`, `/healthz` and `/readyz` beside its verbs).
pub async fn serve_extender(
    listener: TcpListener,
    client: kube::Client,
    projection: Projection,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
) -> Result<(), Error> {
    let extender = Extender::new(client, projection, config, metrics.extender.clone());
    let router = extender.router().merge(metrics.router());
    axum::serve(listener, router)
        .await
        .map_err(Error::serve("serving the extender"))
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task
/// is dropped.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>) -> Result<(), Error> {
    axum::serve(listener, metrics.router())
        .await
        .map_err(Error::serve("serving /metrics"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_flags_default_to_every_five_minutes_over_six_hours_and_refuse_nonsense() {
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "tessera-controller",
                "--tls-cert-file=c",
                "--tls-key-file=k",
            ];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv)
        };
        let tuning = parse(&[]).unwrap().tuning().unwrap();
        assert_eq!(tuning.interval.as_secs(), 300);
        assert_eq!(tuning.window.as_secs(), 6 * 3600);
        assert_eq!(tuning.thresholds.min_span.as_secs(), 3600);
        assert_eq!(tuning.thresholds.wait.as_secs(), 600);
        assert_eq!(tuning.write_gap.as_secs(), 600);
        let error = parse(&["--tuning-interval-seconds=0"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--tuning-interval-seconds"), "{error}");
        let error = parse(&["--tuning-window-seconds=10"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--tuning-window-seconds"), "{error}");
        let error = parse(&[
            "--tuning-window-seconds=600",
            "--tuning-min-observed-seconds=601",
        ])
        .unwrap()
        .tuning()
        .unwrap_err()
        .to_string();
        assert!(
            error.contains(
                "--tuning-min-observed-seconds (601) must not exceed --tuning-window-seconds (600)"
            ),
            "{error}"
        );
    }

    #[test]
    fn metrics_listen_apart_from_the_loopback_extender() {
        let args = Args::try_parse_from([
            "tessera-controller",
            "--tls-cert-file=/tls/tls.crt",
            "--tls-key-file=/tls/tls.key",
        ])
        .unwrap();
        assert_eq!(args.extender_addr.to_string(), "127.0.0.1:8888");
        assert_eq!(args.metrics_addr.to_string(), "0.0.0.0:9395");
        assert_eq!(args.agent_lease_namespace, "kube-node-lease");
        assert!(args.agent_namespace.is_empty(), "agent pods: not watched");
        assert_eq!(
            args.agent_selector,
            "app.kubernetes.io/component=node-agent"
        );

        let args = Args::try_parse_from([
            "tessera-controller",
            "--tls-cert-file=/tls/tls.crt",
            "--tls-key-file=/tls/tls.key",
            "--metrics-addr=127.0.0.1:19395",
            "--agent-lease-namespace=",
        ])
        .unwrap();
        assert_eq!(args.metrics_addr.to_string(), "127.0.0.1:19395");
        assert!(args.agent_lease_namespace.is_empty(), "empty: not watched");
        assert!(
            Args::try_parse_from([
                "tessera-controller",
                "--tls-cert-file=c",
                "--tls-key-file=k",
                "--metrics-addr=9395",
            ])
            .is_err(),
            "an address needs a host"
        );
    }

    #[test]
    fn profiling_is_off_unless_asked_and_on_loopback() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let base = [
            "tessera-controller",
            "--tls-cert-file=/tls/tls.crt",
            "--tls-key-file=/tls/tls.key",
        ];
        let args = Args::try_parse_from(base).unwrap();
        assert!(!args.profiling.profiling);
        assert_eq!(args.profiling.profiling_addr.to_string(), "127.0.0.1:6060");
        let on = base
            .iter()
            .copied()
            .chain(["--profiling", "--profiling-addr=127.0.0.1:7000"]);
        let args = Args::try_parse_from(on).unwrap();
        assert!(args.profiling.profiling);
        assert_eq!(args.profiling.profiling_addr.to_string(), "127.0.0.1:7000");
        let bad = base.iter().copied().chain(["--profiling=maybe"]);
        let error = Args::try_parse_from(bad).unwrap_err().to_string();
        assert!(error.contains("--profiling"), "{error}");
    }
}
