//! One run at one size: a control plane with kwok, the simulated fleet and
//! its background occupancy, tessera-controller with kube-scheduler, then
//! the measurements ([`Figures`]).

use std::time::{Duration, Instant};

use kube::Client;
use tessera_e2e::{ControlPlane, artifacts::Artifacts, stack::Tessera};

use crate::{
    Error,
    burst::{self, Burst},
    fleet::{self, Shape},
    measure::{self, ProcessStats},
    occupancy,
    pods::{self, GpuAsk},
    prom,
    rng::Rng,
};

/// Writes a second below which the API server counts as quiet before a
/// burst (Lease renewals are about 6 a second at 5,000 nodes).
pub const QUIET_WRITES_PER_SECOND: f64 = 20.0;

/// How long a burst waits for the API server to be quiet at most.
pub const QUIET_LIMIT: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The fleet.
    pub shape: Shape,
    /// Pods per burst (GPU and plain each).
    pub burst: usize,
    /// Seed of the GPU pods' sizes.
    pub seed: u64,
    /// Filter+Prioritize round trips timed from outside.
    pub probe_calls: usize,
    /// How long a burst may take.
    pub burst_limit: Duration,
    /// Where the cluster's state and component logs go (kept after the
    /// run, emptied before it); `None`: a temporary directory.
    pub dir: Option<std::path::PathBuf>,
    /// Takes a CPU profile of the controller (`--profiling`) for this many
    /// seconds from the start of the GPU burst, into `<dir>/cpu-gpu-burst.pb`.
    /// The profiler's sample table (about 140 MB, kept once made) then
    /// counts in the controller's memory figures.
    pub cpu_profile_seconds: Option<u64>,
}

/// A running cluster at one size.
pub struct Running {
    /// The control plane (etcd, kube-apiserver, kwok, kube-scheduler, tessera-controller).
    pub plane: ControlPlane,
    /// tessera-controller.
    pub tessera: Tessera,
    /// An admin client.
    pub client: Client,
    /// The simulated nodes.
    pub nodes: Vec<String>,
    /// What it was started with.
    pub options: Options,
    /// Seconds to create the fleet, and to write the background occupancy.
    pub setup_seconds: (f64, f64),
    /// The controller's `--profiling-addr` port, when profiled.
    pub profiling: Option<u16>,
    /// Background pods written.
    pub background: usize,
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// Simulated nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus: u32,
    /// Background pods (one allocation each).
    pub background: usize,
    /// Seconds to create the fleet and to write the background.
    pub setup_seconds: (f64, f64),
    /// Plain pods bound per second (default profile, no extender).
    pub plain_rate: f64,
    /// GPU pods bound per second (tessera-scheduler profile, the extender).
    pub gpu_rate: f64,
    /// Seconds to create the GPU burst's pods (through the webhook), and the
    /// plain burst's.
    pub created_seconds: (f64, f64),
    /// Nodes the GPU burst went to, and the most GPU pods on one node.
    pub gpu_spread: (usize, usize),
    /// The extender's own latency, p50/p99 ms, during the GPU burst.
    pub filter_ms: (f64, f64),
    /// See [`Figures::filter_ms`].
    pub prioritize_ms: (f64, f64),
    /// See [`Figures::filter_ms`].
    pub bind_ms: (f64, f64),
    /// Filter + Prioritize round trips over HTTP naming every node, p50/p99
    /// ms: what kube-scheduler sends with `percentageOfNodesToScore: 100`.
    pub http_ms: (f64, f64),
    /// Of those round trips, the client's JSON encoding and decoding
    /// (kube-scheduler's side), p50 and p99 in ms.
    pub http_client_ms: (f64, f64),
    /// How many names kube-scheduler sends in one Filter call with its
    /// default `percentageOfNodesToScore`
    /// ([`measure::names_kube_scheduler_sends`]).
    pub sent_nodes: usize,
    /// Filter + Prioritize round trips over HTTP naming that many nodes,
    /// p50/p99 ms: what each GPU pod costs kube-scheduler by default.
    pub http_sent_ms: (f64, f64),
    /// API requests per GPU pod during the GPU burst, by verb and resource.
    pub requests_per_gpu_pod: Vec<(String, f64)>,
    /// The same for the plain burst.
    pub requests_per_plain_pod: Vec<(String, f64)>,
    /// The controller before the bursts (background loaded).
    pub idle: ProcessStats,
    /// The controller after the GPU burst.
    pub after: ProcessStats,
    /// Controller CPU milliseconds per GPU pod of the burst.
    pub cpu_ms_per_pod: f64,
    /// Seconds from a controller restart to `/readyz`.
    pub restart_ready_seconds: f64,
    /// Seconds from a controller restart to a new GPU pod's binding.
    pub restart_bind_seconds: f64,
    /// NodeLock waits in Bind during the GPU burst: p50/p90/p99 ms.
    pub lock_wait_ms: (f64, f64, f64),
    /// How many Binds waited on the lock (histogram count).
    pub lock_waits: f64,
    /// Lock wait histogram of the burst: (upper bound s, cumulative count).
    pub lock_wait_buckets: Vec<(f64, f64)>,
    /// CPU seconds each component used during the plain burst and during
    /// the GPU burst (to its settling): where the machine's two cores went.
    pub cpu_by_component: Vec<(String, f64, f64)>,
    /// Wall seconds of the plain and the GPU burst windows those cover.
    pub windows: (f64, f64),
    /// Seconds waited for the API server to be quiet before the plain and
    /// the GPU burst (`None`: still busy after [`QUIET_LIMIT`]).
    pub quiet_seconds: (Option<f64>, Option<f64>),
    /// Extender calls that failed and Binds undone during the GPU burst.
    pub failures: Vec<(String, f64)>,
}

impl Running {
    /// Starts everything and waits until the controller has folded the
    /// whole fleet.
    pub async fn start(options: Options, artifacts: &Artifacts) -> Result<Self, Error> {
        if let Some(dir) = &options.dir {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("empty", dir.display())(e)),
            }
        }
        let plane = ControlPlane::start_with(tessera_e2e::Options {
            dir: options.dir.clone(),
            // Profiled runs profile the API server too (the flag given last wins).
            apiserver_args: match options.cpu_profile_seconds {
                Some(_) => vec!["--profiling=true".to_owned()],
                None => Vec::new(),
            },
            ..tessera_e2e::Options::default()
        })
        .await?;
        plane.start_kwok()?;
        let client = plane.client().await?;
        pods::create_namespace(&client).await?;
        let started = Instant::now();
        let nodes = fleet::create(&client, options.shape).await?;
        let fleet_seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            nodes = nodes.len(),
            seconds = fleet_seconds,
            "fleet published"
        );
        let started = Instant::now();
        let background = occupancy::fill(&client, options.shape).await?;
        // kwok's status writes must not fall into a measurement (at 1,000
        // nodes it was still catching up with the background in the bursts).
        let deadline = Instant::now() + Duration::from_secs(1800);
        while occupancy::any_pending(&client).await? {
            plane.check_running()?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "kwok to run every background pod".into(),
                    seconds: 1800,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tracing::info!(
            seconds = started.elapsed().as_secs_f64(),
            "background running"
        );
        let background_seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            background,
            seconds = background_seconds,
            "background written"
        );
        let profiling = match options.cpu_profile_seconds {
            Some(_) => Some(tessera_e2e::free_port()?),
            None => None,
        };
        let extra: Vec<String> = profiling
            .map(|port| {
                vec![
                    "--profiling".to_owned(),
                    format!("--profiling-addr=127.0.0.1:{port}"),
                ]
            })
            .unwrap_or_default();
        let tessera = Tessera::deploy_scheduling_with(&plane, artifacts, &extra).await?;
        let running = Self {
            plane,
            tessera,
            client,
            nodes,
            options,
            setup_seconds: (fleet_seconds, background_seconds),
            background,
            profiling,
        };
        running.wait_folded(Duration::from_secs(600)).await?;
        Ok(running)
    }

    /// The controller's metrics address.
    pub fn metrics_addr(&self) -> String {
        format!("127.0.0.1:{}", self.tessera.extender_port)
    }

    fn controller_pid(&self) -> Result<u32, Error> {
        self.tessera.pid(&self.plane).ok_or_else(|| Error::Measure {
            what: "tessera-controller".into(),
            why: "it is not running".into(),
        })
    }

    /// Waits until the controller counts every simulated node.
    async fn wait_folded(&self, limit: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + limit;
        loop {
            let samples = measure::controller(&self.metrics_addr()).await?;
            if prom::sum(&samples, "tessera_gpu_nodes", &[]) >= self.nodes.len() as f64 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "tessera-controller to fold every GpuNode".into(),
                    seconds: limit.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits, at most [`QUIET_LIMIT`], until the API server is answering
    /// fewer than [`QUIET_WRITES_PER_SECOND`], so a burst does not share
    /// the cores with kwok's trailing status writes; returns how long that
    /// took.
    async fn wait_quiet(&self) -> Result<Option<f64>, Error> {
        let waited =
            measure::wait_quiet(&self.client, QUIET_WRITES_PER_SECOND, QUIET_LIMIT).await?;
        match waited {
            Some(waited) => tracing::info!(seconds = waited.as_secs_f64(), "API server quiet"),
            None => tracing::warn!(
                limit_seconds = QUIET_LIMIT.as_secs(),
                "the API server was still busy; timing the burst anyway"
            ),
        }
        Ok(waited.map(|w| w.as_secs_f64()))
    }

    /// Waits until no NodeLock is held and no allocation is left `Bound`
    /// (every GPU pod of a burst is Running and its allocation Allocated).
    pub async fn wait_settled(&self, limit: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + limit;
        loop {
            let samples = measure::controller(&self.metrics_addr()).await?;
            let locks = prom::sum(&samples, "tessera_node_locks", &[]);
            let bound = prom::sum(&samples, "tessera_allocations", &[("phase", "Bound")]);
            if locks == 0.0 && bound == 0.0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "the burst to settle ({locks} NodeLocks, {bound} allocations Bound)"
                    ),
                    seconds: limit.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `count` GPU pods of role `role`, one GPU each, 1–20 GiB and 0–50 % cores.
    pub fn gpu_pods(
        &self,
        role: &str,
        count: usize,
        rng: &mut Rng,
    ) -> Vec<k8s_openapi::api::core::v1::Pod> {
        (0..count)
            .map(|i| {
                let ask = GpuAsk {
                    memory_mib: rng.between(1, 20) * 1024,
                    cores: rng.between(0, 50) as u32,
                };
                pods::pod(&format!("{role}-{i:05}"), role, Some(ask))
            })
            .collect()
    }

    /// `count` plain pods of role `role`.
    pub fn plain_pods(&self, role: &str, count: usize) -> Vec<k8s_openapi::api::core::v1::Pod> {
        (0..count)
            .map(|i| pods::pod(&format!("{role}-{i:05}"), role, None))
            .collect()
    }

    /// With `cpu_profile_seconds`, starts taking the controller's and the API
    /// server's CPU profiles and returns the task that writes them.
    fn profile_cpu(&self) -> Option<tokio::task::JoinHandle<Result<std::path::PathBuf, Error>>> {
        let seconds = self.options.cpu_profile_seconds?;
        let port = self.profiling?;
        let path = self.plane.dir().join("cpu-gpu-burst.pb");
        let apiserver_path = self.plane.dir().join("apiserver-cpu-gpu-burst.pb");
        let client = self.client.clone();
        Some(tokio::spawn(async move {
            let write = |path: &std::path::Path, bytes: Vec<u8>| {
                std::fs::write(path, bytes).map_err(|e| Error::Measure {
                    what: path.display().to_string(),
                    why: e.to_string(),
                })
            };
            let (addr, profile) = (
                format!("127.0.0.1:{port}"),
                format!("/debug/pprof/profile?seconds={seconds}"),
            );
            let (ours, apiserver) = tokio::join!(
                measure::fetch(&addr, &profile),
                measure::apiserver_profile(&client, seconds),
            );
            write(&path, ours?)?;
            match apiserver.and_then(|bytes| write(&apiserver_path, bytes)) {
                Ok(()) => {
                    tracing::info!(path = %apiserver_path.display(), "the API server's CPU profile of the GPU burst")
                }
                Err(error) => tracing::warn!(%error, "no CPU profile of the API server"),
            }
            Ok(path)
        }))
    }

    /// When profiled, writes the controller's heap profile (what is in use
    /// now, sampled since start) to `<dir>/<name>` and says where.
    async fn profile_heap(&self, name: &str) {
        let Some(port) = self.profiling else {
            return;
        };
        let path = self.plane.dir().join(name);
        let fetched = measure::fetch(&format!("127.0.0.1:{port}"), "/debug/pprof/heap").await;
        match fetched.and_then(|bytes| {
            std::fs::write(&path, bytes).map_err(|e| Error::Measure {
                what: path.display().to_string(),
                why: e.to_string(),
            })
        }) {
            Ok(()) => tracing::info!(path = %path.display(), "heap profile"),
            Err(error) => tracing::warn!(%error, "no heap profile"),
        }
    }

    /// Runs every measurement once.
    pub async fn measure(&self) -> Result<Figures, Error> {
        let options = &self.options;
        let mut rng = Rng::new(options.seed);
        let pid = self.controller_pid()?;
        let idle = measure::process(pid)?;

        let quiet_plain = self.wait_quiet().await?;
        let cpu0 = self.cpu_by_component();
        let window = Instant::now();
        let before = measure::apiserver(&self.client).await?;
        let plain = burst::run(
            &self.client,
            self.plain_pods("plain", options.burst),
            options.burst_limit,
        )
        .await?;
        burst::wait_running(&self.client, "plain", plain.pods, options.burst_limit).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = measure::apiserver(&self.client).await?;
        let plain_window = window.elapsed().as_secs_f64();
        let cpu1 = self.cpu_by_component();
        let requests_per_plain_pod =
            per_pod(measure::requests_between(&before, &after), plain.pods);
        tracing::info!(rate = plain.rate(), "plain burst");
        let quiet_gpu = self.wait_quiet().await?;

        let cpu_gpu_start = self.cpu_by_component();
        let window = Instant::now();
        let api_before = measure::apiserver(&self.client).await?;
        let ours_before = measure::controller(&self.metrics_addr()).await?;
        let cpu_before = measure::process(pid)?;
        let batch = self.gpu_pods("gpu", options.burst, &mut rng);
        let profile = self.profile_cpu();
        let gpu: Burst = burst::run(&self.client, batch, options.burst_limit).await?;
        if let Some(profile) = profile {
            let written = profile
                .await
                .map_err(|joined| joined.to_string())
                .and_then(|written| written.map_err(|error| error.to_string()));
            match written {
                Ok(path) => tracing::info!(path = %path.display(), "CPU profile of the GPU burst"),
                Err(error) => tracing::warn!(%error, "no CPU profile of the GPU burst"),
            }
        }
        tracing::info!(rate = gpu.rate(), "GPU burst");
        self.wait_settled(Duration::from_secs(300)).await?;
        self.profile_heap("heap-after-gpu-burst.pb").await;
        let cpu_after = measure::process(pid)?;
        let ours_after = measure::controller(&self.metrics_addr()).await?;
        let api_after = measure::apiserver(&self.client).await?;
        let gpu_window = window.elapsed().as_secs_f64();
        let cpu2 = self.cpu_by_component();
        let cpu_by_component = cpu0
            .iter()
            .map(|(name, c0)| {
                let at = |list: &[(String, f64)]| {
                    list.iter()
                        .find(|(n, _)| n == name)
                        .map_or(*c0, |(_, c)| *c)
                };
                (name.clone(), at(&cpu1) - c0, at(&cpu2) - at(&cpu_gpu_start))
            })
            .collect();
        let requests_per_gpu_pod =
            per_pod(measure::requests_between(&api_before, &api_after), gpu.pods);

        let verb = |name: &str| {
            let labels = [("verb", name), ("outcome", "ok")];
            let histogram = "tessera_extender_request_duration_seconds";
            prom::delta(
                &prom::buckets(&ours_after, histogram, &labels),
                &prom::buckets(&ours_before, histogram, &labels),
            )
        };
        let ms = |b: &[(f64, f64)], q: f64| prom::quantile(b, q).map_or(f64::NAN, |s| s * 1e3);
        let p50_99 = |b: Vec<(f64, f64)>| (ms(&b, 0.5), ms(&b, 0.99));
        let lock = prom::delta(
            &prom::buckets(&ours_after, "tessera_bind_lock_wait_duration_seconds", &[]),
            &prom::buckets(&ours_before, "tessera_bind_lock_wait_duration_seconds", &[]),
        );

        let probe = pods::as_scheduled(&pods::pod(
            "probe",
            "probe",
            Some(GpuAsk {
                memory_mib: 10_240,
                cores: 20,
            }),
        ));
        let trips = measure::filter_and_prioritize(
            &self.metrics_addr(),
            &probe,
            &self.nodes,
            options.probe_calls,
        )
        .await?;
        let sent_nodes = measure::names_kube_scheduler_sends(self.nodes.len());
        let sent = measure::filter_and_prioritize(
            &self.metrics_addr(),
            &probe,
            &self.nodes[..sent_nodes],
            options.probe_calls,
        )
        .await?;

        let (restart_ready_seconds, restart_bind_seconds) = self.restart_to_first_bind().await?;
        Ok(Figures {
            nodes: self.nodes.len(),
            gpus: options.shape.gpus,
            background: self.background,
            setup_seconds: self.setup_seconds,
            plain_rate: plain.rate(),
            gpu_rate: gpu.rate(),
            created_seconds: (gpu.created.as_secs_f64(), plain.created.as_secs_f64()),
            gpu_spread: gpu.spread(),
            filter_ms: p50_99(verb("filter")),
            prioritize_ms: p50_99(verb("prioritize")),
            bind_ms: p50_99(verb("bind")),
            http_ms: (
                measure::percentile_ms(&trips.total, 0.5),
                measure::percentile_ms(&trips.total, 0.99),
            ),
            http_client_ms: (
                measure::percentile_ms(&trips.client, 0.5),
                measure::percentile_ms(&trips.client, 0.99),
            ),
            sent_nodes,
            http_sent_ms: (
                measure::percentile_ms(&sent.total, 0.5),
                measure::percentile_ms(&sent.total, 0.99),
            ),
            requests_per_gpu_pod,
            requests_per_plain_pod,
            idle,
            after: cpu_after,
            cpu_ms_per_pod: (cpu_after.cpu_seconds - cpu_before.cpu_seconds) * 1e3
                / gpu.pods as f64,
            restart_ready_seconds,
            restart_bind_seconds,
            lock_wait_ms: (ms(&lock, 0.5), ms(&lock, 0.9), ms(&lock, 0.99)),
            lock_waits: lock.last().map_or(0.0, |(_, n)| *n),
            lock_wait_buckets: lock,
            failures: measure::failures_between(&ours_before, &ours_after),
            cpu_by_component,
            windows: (plain_window, gpu_window),
            quiet_seconds: (quiet_plain, quiet_gpu),
        })
    }

    /// CPU seconds so far of every component of the control plane (etcd,
    /// kube-apiserver, kwok, kube-scheduler, tessera-controller) and of this
    /// process (the bench's own client).
    fn cpu_by_component(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = self
            .plane
            .pids()
            .into_iter()
            .filter_map(|(name, pid)| Some((name, measure::process(pid).ok()?.cpu_seconds)))
            .collect();
        if let Ok(own) = measure::process(std::process::id()) {
            out.push(("bench client".into(), own.cpu_seconds));
        }
        out
    }

    /// Restarts the controller and times it to `/readyz` and to binding a
    /// GPU pod created as it starts (created as soon as the webhook answers).
    pub async fn restart_to_first_bind(&self) -> Result<(f64, f64), Error> {
        self.tessera.stop(&self.plane);
        let started = Instant::now();
        let pod = pods::pod(
            "after-restart",
            "after-restart",
            Some(GpuAsk {
                memory_mib: 4096,
                cores: 10,
            }),
        );
        let bind = burst::run(&self.client, vec![pod], Duration::from_secs(300));
        let ready = async {
            self.tessera.start(&self.plane).await?;
            Ok::<_, Error>(started.elapsed().as_secs_f64())
        };
        let (ready, bind) = tokio::join!(ready, bind);
        let bound = bind?.finished.duration_since(started);
        Ok((ready?, bound.as_secs_f64()))
    }
}

fn per_pod(requests: Vec<(String, f64)>, pods: usize) -> Vec<(String, f64)> {
    requests
        .into_iter()
        .map(|(key, n)| (key, n / pods.max(1) as f64))
        .collect()
}
