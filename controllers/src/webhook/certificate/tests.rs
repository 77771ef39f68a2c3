//! A rotated certificate is served after the next check; a pair that cannot
//! be used is refused and the previous certificate stays in service.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tessera_e2e::pki::Pki;

use super::*;
use crate::{
    config::Config,
    projection::Projection,
    webhook::{Webhook, WebhookMetrics},
};

/// A directory removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tessera-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two unrelated CAs, each with a serving certificate for localhost.
fn two_pkis(scratch: &Scratch) -> (Pki, Pki) {
    let pki = |name: &str| {
        let dir = scratch.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Pki::create(&dir).unwrap()
    };
    (pki("first"), pki("second"))
}

/// Puts `cert` and `key` where the webhook reads them.
fn install(cert: &Path, key: &Path, to: &(PathBuf, PathBuf)) {
    std::fs::copy(key, &to.1).unwrap();
    std::fs::copy(cert, &to.0).unwrap();
}

fn der(pem: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(pem).unwrap().to_vec()
}

/// The certificate a TLS handshake with 127.0.0.1:`port` presents, trusting
/// any of the `cas`.
fn served_certificate(port: u16, cas: &[&Path]) -> std::io::Result<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from_pem_file(ca).unwrap())
            .unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port))?;
    socket.set_read_timeout(Some(Duration::from_secs(5)))?;
    while connection.is_handshaking() {
        connection.complete_io(&mut socket)?;
    }
    Ok(connection.peer_certificates().unwrap()[0].to_vec())
}

/// Waits until `check` holds, or fails after 10 s.
async fn eventually(what: &str, check: impl AsyncFn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the handshake presents `expected`, or fails after 10 s.
async fn wait_served(port: u16, cas: [PathBuf; 2], expected: Vec<u8>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let cas = cas.clone();
        let served =
            tokio::task::spawn_blocking(move || served_certificate(port, &[&cas[0], &cas[1]]))
                .await
                .unwrap();
        if served.as_ref().is_ok_and(|s| *s == expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: last handshake {served:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_rotated_certificate_is_served_and_a_broken_one_is_refused() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scratch = Scratch::new("webhook-rotation");
    let (first, second) = two_pkis(&scratch);
    let files = (scratch.0.join("tls.crt"), scratch.0.join("tls.key"));
    install(&first.serving_cert, &first.serving_key, &files);

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (projection, _feeder) = Projection::new();
    let webhook = Webhook::new(
        Arc::new(Config::default()),
        projection.clone(),
        WebhookMetrics::unregistered(),
    );
    let watched =
        CertificateFiles::new(&files.0, &files.1).checked_every(Duration::from_millis(50));
    let counts = watched.counts();
    let server = tokio::spawn(crate::webhook::serve(listener, watched, webhook));
    let cas = [first.ca_cert.clone(), second.ca_cert.clone()];

    wait_served(
        port,
        cas.clone(),
        der(&first.serving_cert),
        "the first certificate",
    )
    .await;

    // cert-manager renews: both files change.
    install(&second.serving_cert, &second.serving_key, &files);
    wait_served(
        port,
        cas.clone(),
        der(&second.serving_cert),
        "the rotated certificate after the next check",
    )
    .await;

    // A certificate that does not match the key in place, then a file that
    // is not PEM at all: both refused, the rotated one stays in service.
    // Each refusal is counted, so the checks below follow a check that ran.
    let refused = |n: u64| {
        let counts = counts.clone();
        async move {
            eventually(&format!("refusal {n} counted"), async || {
                counts.rejected() >= n
            })
            .await;
        }
    };
    std::fs::copy(&first.serving_cert, &files.0).unwrap();
    refused(1).await;
    wait_served(
        port,
        cas.clone(),
        der(&second.serving_cert),
        "the previous certificate, the new pair's key not matching",
    )
    .await;
    std::fs::write(&files.0, "not a certificate").unwrap();
    refused(2).await;
    wait_served(
        port,
        cas.clone(),
        der(&second.serving_cert),
        "the previous certificate, the new file not being PEM",
    )
    .await;
    assert_eq!(counts.reloaded(), 1, "only the rotation was loaded");
    assert!(!server.is_finished(), "the webhook keeps serving");
    server.abort();
}

#[tokio::test]
async fn reloads_happen_once_per_change_and_name_the_files_when_refused() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scratch = Scratch::new("webhook-reload");
    let (first, second) = two_pkis(&scratch);
    let files = (scratch.0.join("tls.crt"), scratch.0.join("tls.key"));
    install(&first.serving_cert, &first.serving_key, &files);
    let mut watched = CertificateFiles::new(&files.0, &files.1);
    let tls = watched.load().await.unwrap();

    assert!(matches!(
        watched.reload_if_changed(&tls).await,
        Reload::Unchanged
    ));
    install(&second.serving_cert, &second.serving_key, &files);
    assert!(matches!(
        watched.reload_if_changed(&tls).await,
        Reload::Reloaded
    ));
    assert!(matches!(
        watched.reload_if_changed(&tls).await,
        Reload::Unchanged
    ));

    std::fs::write(&files.0, "garbage").unwrap();
    let Reload::Rejected(error) = watched.reload_if_changed(&tls).await else {
        panic!("a file that is not PEM is refused");
    };
    assert!(
        error.to_string().contains(&files.0.display().to_string()),
        "{error}"
    );
    // Reported once: the same bad contents are not tried again.
    assert!(matches!(
        watched.reload_if_changed(&tls).await,
        Reload::Unchanged
    ));

    std::fs::remove_file(&files.1).unwrap();
    assert!(matches!(
        watched.reload_if_changed(&tls).await,
        Reload::Rejected(Error::Certificate { .. })
    ));

    // A missing file at start-up is an error naming it.
    let error = CertificateFiles::new(&files.0, scratch.0.join("absent.key"))
        .load()
        .await
        .unwrap_err();
    assert!(error.to_string().contains("absent.key"), "{error}");
}
