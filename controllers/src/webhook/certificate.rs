//! The webhook's serving certificate, read from two PEM files that
//! cert-manager or the chart rotate in place (the kubelet swaps a mounted
//! Secret's files together). The files are read every [`CHECK_EVERY`]; when
//! either changed, the new pair is loaded for every later connection. A pair
//! that cannot be used (unreadable, not PEM, key not matching the
//! certificate) is logged and the certificate in use is kept.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum_server::tls_rustls::RustlsConfig;

use crate::Error;

/// How often the files are checked (a mounted Secret's update reaches the
/// pod within about a minute of the Secret's change).
pub const CHECK_EVERY: Duration = Duration::from_secs(30);

/// What [`CertificateFiles::reload_if_changed`] did.
#[derive(Debug)]
pub enum Reload {
    /// The files hold what was loaded (or rejected) last.
    Unchanged,
    /// The new pair is served from now on.
    Reloaded,
    /// The new files cannot be used; the certificate in use is kept.
    Rejected(Error),
}

/// How many changed pairs [`CertificateFiles::keep_current`] loaded and
/// refused so far.
#[derive(Debug, Default)]
pub struct ReloadCounts {
    reloaded: AtomicU64,
    rejected: AtomicU64,
}

impl ReloadCounts {
    /// Pairs loaded after the first.
    pub fn reloaded(&self) -> u64 {
        self.reloaded.load(Ordering::Relaxed)
    }

    /// Pairs refused (the certificate in use kept).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}

/// The certificate and key files, and what was last read from them.
#[derive(Debug)]
pub struct CertificateFiles {
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    /// The contents last loaded or rejected, so a bad pair is reported once
    /// and a good one is not loaded again.
    seen: Option<(Vec<u8>, Vec<u8>)>,
    counts: Arc<ReloadCounts>,
}

impl CertificateFiles {
    /// The pair at `cert` and `key`, checked every [`CHECK_EVERY`].
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            every: CHECK_EVERY,
            seen: None,
            counts: Arc::default(),
        }
    }

    /// What the files' checks have done so far, kept current by
    /// [`Self::keep_current`].
    pub fn counts(&self) -> Arc<ReloadCounts> {
        self.counts.clone()
    }

    /// Checks the files every `every` instead.
    pub fn checked_every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    fn error(&self, source: std::io::Error) -> Error {
        Error::Certificate {
            cert: self.cert.clone(),
            key: self.key.clone(),
            source,
        }
    }

    async fn read(&self) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let cert = tokio::fs::read(&self.cert)
            .await
            .map_err(|e| self.error(e))?;
        let key = tokio::fs::read(&self.key)
            .await
            .map_err(|e| self.error(e))?;
        Ok((cert, key))
    }

    /// Reads and loads the pair the webhook starts with.
    pub async fn load(&mut self) -> Result<RustlsConfig, Error> {
        let (cert, key) = self.read().await?;
        let tls = RustlsConfig::from_pem(cert.clone(), key.clone())
            .await
            .map_err(|e| self.error(e))?;
        self.seen = Some((cert, key));
        Ok(tls)
    }

    /// Loads the files into `tls` if they changed since they were last read.
    pub async fn reload_if_changed(&mut self, tls: &RustlsConfig) -> Reload {
        let (cert, key) = match self.read().await {
            Ok(pair) => pair,
            // Perhaps caught between two writes: read again next time.
            Err(error) => return Reload::Rejected(error),
        };
        if self
            .seen
            .as_ref()
            .is_some_and(|(c, k)| *c == cert && *k == key)
        {
            return Reload::Unchanged;
        }
        self.seen = Some((cert.clone(), key.clone()));
        match tls.reload_from_pem(cert, key).await {
            Ok(()) => Reload::Reloaded,
            Err(source) => Reload::Rejected(self.error(source)),
        }
    }

    /// Keeps `tls` current with the files until the task is dropped,
    /// logging every reload and every pair it had to refuse.
    pub async fn keep_current(mut self, tls: RustlsConfig) {
        let mut ticks = tokio::time::interval(self.every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is now: just loaded
        loop {
            ticks.tick().await;
            match self.reload_if_changed(&tls).await {
                Reload::Unchanged => {}
                Reload::Reloaded => {
                    self.counts.reloaded.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        cert = %self.cert.display(),
                        key = %self.key.display(),
                        "webhook certificate reloaded"
                    );
                }
                Reload::Rejected(error) => {
                    self.counts.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        %error,
                        "webhook certificate files cannot be used; still serving the previous certificate"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
