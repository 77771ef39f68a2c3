//! Profiles of a live process in pprof's format, as HAMi's `--profiling`
//! serves Go's `net/http/pprof`:
//!
//! - `GET /debug/pprof/profile?seconds=N`: a CPU profile sampled 100 times a
//!   second for N seconds (default 30, at most 300; [`cpu`]);
//! - `GET /debug/pprof/heap`: the memory in use, sampled by jemalloc
//!   (about every 512 KiB allocated) since profiling was switched on
//!   ([`heap`]).
//!
//! Both are read by `go tool pprof`, symbolised already, so the binary is not
//! needed. The binaries that serve them use jemalloc ([`Allocator`]), built
//! able to sample but with sampling off (`.cargo/config.toml`);
//! [`Server::run`] switches sampling on. Never linked into the interposer,
//! which lives in tenants' processes.

#![forbid(unsafe_code)]

pub mod cpu;
pub mod heap;
mod response;

use std::net::SocketAddr;

use axum::{Router, routing::get};

/// The global allocator of `tessera-controller` and `tessera-node-agent`:
/// jemalloc, which can sample heap allocations for `/debug/pprof/heap`.
pub use tikv_jemallocator::Jemalloc as Allocator;

/// Why profiling could not be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `--profiling-addr` listener could not be bound.
    #[error("--profiling-addr {addr}: {source}")]
    Bind {
        /// The address given.
        addr: SocketAddr,
        /// Why it could not be bound.
        source: std::io::Error,
    },
    /// The listener failed while serving.
    #[error("profiling server: {0}")]
    Serve(std::io::Error),
}

/// The `--profiling` flags, the same on every binary that serves profiles
/// (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone)]
pub struct ProfilingArgs {
    /// Serve CPU and heap profiles in pprof's format on `--profiling-addr`,
    /// as HAMi's `--profiling` serves Go's: `go tool pprof
    /// http://ADDR/debug/pprof/profile` or `.../heap` (docs/observability.md).
    #[arg(
        long,
        env = "TESSERA_PROFILING",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = clap::ArgAction::Set
    )]
    pub profiling: bool,
    /// Address of the profiles with `--profiling` (plain HTTP). Loopback by
    /// default, so that only an operator reaches it (`kubectl
    /// port-forward`): a profile shows the process's internals.
    #[arg(long, env = "TESSERA_PROFILING_ADDR", default_value = "127.0.0.1:6060")]
    pub profiling_addr: SocketAddr,
}

impl ProfilingArgs {
    /// The bound listener when `--profiling` is on.
    pub async fn bind(&self) -> Result<Option<Server>, Error> {
        match self.profiling {
            true => Server::bind(self.profiling_addr).await.map(Some),
            false => Ok(None),
        }
    }
}

/// The `/debug/pprof/` routes.
pub fn router() -> Router {
    Router::new()
        .route("/debug/pprof/", get(index))
        .route("/debug/pprof/profile", get(cpu::handler))
        .route("/debug/pprof/heap", get(heap::handler))
}

/// The `--profiling-addr` listener, bound before anything else starts so
/// that a bad address stops the process at once.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
}

impl Server {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        Ok(Self { listener })
    }

    /// The address bound (the port chosen when `addr` named port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Switches heap sampling on and serves [`router`] until the process
    /// ends. Logs and carries on when heap sampling cannot be switched on (a
    /// binary built without the sampling allocator): the CPU profile is still
    /// served and `/debug/pprof/heap` says why it is not.
    pub async fn run(self) -> Result<(), Error> {
        if let Err(error) = heap::activate().await {
            tracing::warn!(%error, "heap profiles are not available");
        }
        if let Some(addr) = self.local_addr() {
            tracing::info!(%addr, "serving CPU and heap profiles under /debug/pprof/");
        }
        axum::serve(self.listener, router())
            .await
            .map_err(Error::Serve)
    }
}

async fn index() -> &'static str {
    "Profiles in pprof's format (read them with `go tool pprof URL`):\n\
     /debug/pprof/profile?seconds=30  CPU, sampled 100 times a second\n\
     /debug/pprof/heap                memory in use (jemalloc's samples)\n"
}
