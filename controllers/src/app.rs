//! The `tessera-controller` process: flags and wiring.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use clap::Parser;
use tokio::net::TcpListener;

use crate::{Error, config::Config, extender::Extender, projection::Projection, webhook::Webhook};

/// Tessera's control plane: kube-scheduler extender (filter, prioritize, bind),
/// mutating webhook, and lifecycle controllers.
#[derive(Parser, Debug, Clone)]
#[command(name = "tessera-controller", version, about)]
pub struct Args {
    /// Cluster-wide settings (YAML): resource names, request defaults,
    /// policies, NodeLock timing. See docs/configuration.md.
    #[arg(long, env = "TESSERA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address the extender listens on (plain HTTP; kube-scheduler runs beside it).
    #[arg(long, env = "TESSERA_EXTENDER_ADDR", default_value = "127.0.0.1:8888")]
    pub extender_addr: SocketAddr,
    /// Address the mutating webhook listens on (HTTPS).
    #[arg(long, env = "TESSERA_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// PEM certificate the webhook serves (the API server must trust its CA).
    #[arg(long, env = "TESSERA_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,
    /// PEM private key of `--tls-cert-file`.
    #[arg(long, env = "TESSERA_TLS_KEY_FILE")]
    pub tls_key_file: PathBuf,
    /// Namespace of the coordination Lease that elects the replica running
    /// the lifecycle controllers.
    #[arg(long, env = "TESSERA_LEASE_NAMESPACE", default_value = "kube-system")]
    pub lease_namespace: String,
    /// This replica's identity in the election (in a pod: its name).
    #[arg(long, env = "POD_NAME", default_value = "tessera-controller")]
    pub identity: String,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "TESSERA_LOG", default_value = "info")]
    pub log: String,
}

impl Args {
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
pub async fn run(args: Args, config: Config, client: kube::Client) -> anyhow::Result<()> {
    let Args {
        config: _,
        extender_addr,
        webhook_addr,
        tls_cert_file,
        tls_key_file,
        lease_namespace,
        identity,
        log: _,
    } = &args;
    let config = Arc::new(config);
    let projection = Projection::spawn(client.clone());
    let election = crate::leader::Election {
        namespace: lease_namespace.clone(),
        name: "tessera-controller".into(),
        identity: identity.clone(),
        lease_duration: std::time::Duration::from_secs(15),
    };
    let lifecycle_client = client.clone();
    tokio::spawn(async move {
        election
            .run(lifecycle_client.clone(), move || {
                crate::lifecycle::run(lifecycle_client.clone())
            })
            .await
    });
    let webhook = std::net::TcpListener::bind(webhook_addr)?;
    tracing::info!(addr = %webhook.local_addr()?, "webhook listening");
    let webhook = serve_webhook(
        webhook,
        tls_cert_file,
        tls_key_file,
        config.clone(),
        projection.clone(),
    );
    let listener = TcpListener::bind(extender_addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "extender listening");
    tokio::select! {
        result = serve_extender(listener, client, projection, config) => result,
        result = webhook => result,
    }
}

/// Serves the webhook over HTTPS on `listener` until the task is dropped.
pub async fn serve_webhook(
    listener: std::net::TcpListener,
    cert: &std::path::Path,
    key: &std::path::Path,
    config: Arc<Config>,
    projection: Projection,
) -> anyhow::Result<()> {
    // kube and axum-server both use rustls with ring; make ring the process default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
        .await
        .map_err(|e| {
            Error::Config(format!(
                "webhook certificate {} / {}: {e}",
                cert.display(),
                key.display()
            ))
        })?;
    listener.set_nonblocking(true)?;
    let router = Webhook::new(config, projection).router();
    axum_server::from_tcp_rustls(listener, tls)?
        .serve(router.into_make_service())
        .await?;
    Ok(())
}

/// Serves the extender on `listener` until the task is dropped.
pub async fn serve_extender(
    listener: TcpListener,
    client: kube::Client,
    projection: Projection,
    config: Arc<Config>,
) -> anyhow::Result<()> {
    let metrics = crate::metrics::Metrics::new(projection.clone());
    let router = Extender::new(client, projection, config, metrics).router();
    axum::serve(listener, router).await?;
    Ok(())
}
